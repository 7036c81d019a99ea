//! The shim payloads: Hello (what the agent decodes from a shim) and LedgerReply (what a
//! shim decodes from the agent). They never panic, and a decoded Hello re-encodes to its bytes.
#![no_main]

use fgpu_common::proto::shim;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(hello) = shim::HelloPayload::decode(data) {
        assert_eq!(&hello.encode()[..], &data[..8]);
    } else {
        assert!(data.len() < 8);
    }
    if let Some((_, path)) = shim::decode_ledger_reply(data) {
        assert_eq!(shim::encode_ledger_reply(path)[8..], data[8..]);
    }
});
