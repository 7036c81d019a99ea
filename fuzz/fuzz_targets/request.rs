//! Every control request's payload (status, limit set/get/ls/rm JSON, and any other kind),
//! decoded as the agent decodes it: an answer or an error message, never a panic.
#![no_main]

use fgpu_common::proto::{Frame, Kind};
use fgpu_fuzz::request;
use libfuzzer_sys::fuzz_target;

const KINDS: [Kind; 10] = [
    Kind::StatusRequest,
    Kind::LimitSet,
    Kind::LimitGet,
    Kind::LimitList,
    Kind::LimitRemove,
    Kind::Hello,
    Kind::StatusReply,
    Kind::LimitReply,
    Kind::LedgerReply,
    Kind::Error,
];

fuzz_target!(|data: &[u8]| {
    let Some((&which, payload)) = data.split_first() else {
        return;
    };
    let kind = KINDS[usize::from(which) % KINDS.len()];
    let frame = Frame::new(kind, payload.to_vec());
    match request::decode(&frame) {
        Ok(req) => {
            let _ = (req.name(), req.changes_state());
        }
        Err(msg) => assert!(!msg.is_empty()),
    }
});
