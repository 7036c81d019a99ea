//! Asking the agent for room: an allocation or an unpark the driver refused for want of
//! device memory asks the agent to park an idle parkable container on that device, and
//! retries once it has (docs/parking.md, "Room").
//!
//! The request is this process's slot (`need_*`); the answer is the ledger's page 0
//! (`room_for`, `room_verdict`), which only the agent writes. No agent, no answer within
//! [`ANSWER_MS`], or "none": the caller fails the way it would have without parking.

use fgpu_common::ledger::park::{ROOM_COMING, ROOM_DONE, ROOM_NONE};

use crate::ledger;

/// How long the agent has to take up a request (it looks every 50 ms; a node busy enough
/// to delay it for a second must not turn an allocation that parking can serve into an
/// out-of-memory error: seen at 400 ms with the agent's tests run in parallel on two cores).
const ANSWER_MS: u64 = 2_000;
/// How long a park the agent started may take before the caller gives up.
const COMING_MS: u64 = 120_000;

/// Asks for `bytes` of room on ledger device `idx`; true once another container was parked
/// (retry), false if none will be.
pub fn ask(idx: usize, bytes: u64) -> bool {
    if !ledger::current().2 {
        return false; // no agent
    }
    let Some((l, slot)) = ledger::get() else {
        return false;
    };
    if l.park()
        .parkable_peers
        .load(std::sync::atomic::Ordering::Relaxed)
        == 0
    {
        return false; // nobody could be parked: fail at once, as without parking
    }
    let sp = l.slot_park(slot);
    let tag = sp.ask_room(slot, idx, bytes);
    let start = crate::sys::now_ms();
    let answer = loop {
        // SAFETY: plain sleep.
        unsafe { libc::usleep(10_000) };
        let now = crate::sys::now_ms();
        let p = l.park();
        let for_us = p.room_for.load(std::sync::atomic::Ordering::SeqCst) == tag;
        let verdict = p.room_verdict.load(std::sync::atomic::Ordering::SeqCst);
        match (for_us, verdict) {
            (true, ROOM_DONE) => break true,
            (true, ROOM_NONE) => break false,
            (true, ROOM_COMING) if now.saturating_sub(start) < COMING_MS => continue,
            (false, _) if now.saturating_sub(start) < ANSWER_MS => continue,
            _ => break false,
        }
    };
    sp.room_done();
    crate::log::debug!(
        "parking: asked for {bytes} bytes of room on device record {idx}: {}",
        if answer { "made" } else { "none" }
    );
    answer
}
