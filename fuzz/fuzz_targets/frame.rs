//! The frame decoder, on arbitrary bytes fed in arbitrary pieces, with the containers' and the
//! admin socket's caps: it only ever returns (a frame, "need more" or an error), never takes
//! more than the cap, and what it takes re-encodes to the bytes it consumed.
#![no_main]

use bytes::BytesMut;
use fgpu_common::proto::{Frame, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    for max in [1024usize, 64 << 10] {
        let step = usize::from(split).max(1);
        let mut buf = BytesMut::new();
        let mut consumed = 0usize;
        for piece in rest.chunks(step) {
            buf.extend_from_slice(piece);
            loop {
                let before = buf.len();
                match Frame::decode_max(&mut buf, max) {
                    Ok(Some(frame)) => {
                        assert!(frame.payload.len() <= max);
                        assert_eq!(before - buf.len(), HEADER_LEN + frame.payload.len());
                        let mut again = BytesMut::new();
                        frame
                            .encode(&mut again)
                            .expect("a decoded frame re-encodes");
                        assert_eq!(&again[..], &rest[consumed..consumed + again.len()]);
                        consumed += again.len();
                    }
                    Ok(None) => {
                        assert_eq!(before, buf.len());
                        // Never more buffered than one largest frame's worth.
                        assert!(buf.len() < HEADER_LEN + max + step);
                        break;
                    }
                    Err(_) => return,
                }
            }
        }
    }
});
