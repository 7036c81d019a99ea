//! Bringing a parked process's memory back, at its first call through the door.
//!
//! Waiting is for what other tenants hold: the limit (a charge over it waits until the
//! container frees memory or its limit is raised) and the device's room (asked of the agent,
//! which may park another container). Any other failure of the driver (a sticky error of a
//! broken context, a device fault) does not go away by waiting: after [`BROKEN_TRIES`] the
//! unpark gives up, says so, and the process's calls go straight to the driver from then on,
//! which answers them with its error. The memory not brought back stays in host memory
//! until the process ends.

use super::*;

/// How often a stuck unpark says so.
const STUCK_LOG_MS: u64 = 10_000;
/// Tries of a driver call that fails for another reason than memory before the unpark
/// gives up.
const BROKEN_TRIES: u32 = 3;

/// A driver call that failed, as the log says it.
struct Broken {
    call: &'static str,
    rc: CUresult,
}

/// Runs `f` (given `stuck`, for waits of its own) until it succeeds; a failure is said
/// through `stuck` and tried again, [`BROKEN_TRIES`] times in all.
fn retried<T>(
    stuck: &mut dyn FnMut(&dyn std::fmt::Display),
    mut f: impl FnMut(&mut dyn FnMut(&dyn std::fmt::Display)) -> Result<T, backing::Failed>,
) -> Result<T, Broken> {
    let mut tries = 0;
    loop {
        match f(stuck) {
            Ok(v) => return Ok(v),
            Err(e) => {
                tries += 1;
                if tries >= BROKEN_TRIES {
                    return Err(Broken {
                        call: e.call,
                        rc: e.rc,
                    });
                }
                stuck(&format_args!("{} failed ({})", e.call, e.rc));
            }
        }
    }
}

/// Brings this process's memory back (any thread; the others wait on the lock).
pub(super) fn unpark() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if PHASE.load(SeqCst) != PARKED || BROKEN.load(SeqCst) {
        return;
    }
    let Some((l, slot)) = ledger::get() else {
        return;
    };
    let sp = l.slot_park(slot);
    let t0 = fgpu_common::clock::mono_ns();
    PHASE.store(UNPARKING, SeqCst);
    sp.phase.store(UNPARKING, SeqCst);
    let mut recs = RECORDS.lock().unwrap_or_else(|e| e.into_inner());
    let mut total = 0u64;
    let mut waited_ns = 0u64;
    let mut said = crate::sys::now_ms();
    let mut stuck = |what: &dyn std::fmt::Display| {
        let now = crate::sys::now_ms();
        if now.saturating_sub(said) >= STUCK_LOG_MS {
            warning!("unparking waits: {what}");
            said = now;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let mut broken: Option<Broken> = None;
    // Per context, a stream for its copies: physical memory is made and mapped while the
    // copies queued before it run.
    let mut streams: Vec<(crate::real::Handle, crate::real::Handle)> = Vec::new();
    for r in recs.iter_mut().filter(|r| r.handle == 0) {
        let w0 = fgpu_common::clock::mono_ns();
        // The limit still applies: charge first (a limit lowered meanwhile makes this wait).
        while let Err(d) = account::reserve_at("unpark", (l, slot), r.ord, r.idx, r.size, |_| {}) {
            stuck(&format_args!(
                "{} bytes over the limit ({} in use, limit {})",
                r.size, d.used, d.limit
            ));
        }
        let created = retried(&mut stuck, |stuck| {
            loop {
                match backing::create(r.ord, r.size) {
                    Err(e) if e.rc == CUDA_ERROR_OUT_OF_MEMORY => {
                        if !room::ask(r.idx, r.size) {
                            stuck(&format_args!("the device has no room for {} bytes", r.size));
                        }
                    }
                    other => break other,
                }
            }
        });
        let h = match created {
            Ok(h) => h,
            Err(b) => {
                account::release(r.idx, r.size);
                broken = Some(b);
                break;
            }
        };
        waited_ns += fgpu_common::clock::mono_ns().saturating_sub(w0);
        if let Err(b) = retried(&mut stuck, |_| backing::map(r.va, r.size, h, r.ord)) {
            backing::release(h);
            account::release(r.idx, r.size);
            broken = Some(b);
            break;
        }
        let s = match streams.iter().find(|(c, _)| *c == r.ctx) {
            Some(&(_, s)) => Some(s),
            None => match backing::in_ctx(r.ctx, backing::stream) {
                Ok(Ok(s)) => {
                    streams.push((r.ctx, s));
                    Some(s)
                }
                _ => None,
            },
        };
        let copied = backing::in_ctx(r.ctx, || match s {
            Some(s) => backing::copy_in(r.va, r.host, r.size, s),
            None => backing::copy_in(r.va, r.host, r.size, std::ptr::null_mut())
                .and_then(|()| backing::sync()),
        });
        if let Err(e) = copied.and_then(|r| r) {
            // The host copy stays until the copy is made: try again synchronously.
            crate::log::error!("unparking: {} failed ({}); copying again", e.call, e.rc);
            let again = retried(&mut stuck, |_| {
                backing::in_ctx(r.ctx, || {
                    backing::copy_in(r.va, r.host, r.size, std::ptr::null_mut())
                        .and_then(|()| backing::sync())
                })
                .and_then(|r| r)
            });
            if let Err(b) = again {
                backing::unmap(r.va, r.size);
                backing::release(h);
                account::release(r.idx, r.size);
                broken = Some(b);
                break;
            }
        }
        r.handle = h;
        total += r.size;
    }
    for (c, s) in streams {
        if let Err(e) = backing::in_ctx(c, || backing::finish(s)).and_then(|r| r) {
            crate::log::error!("unparking: {} failed ({})", e.call, e.rc);
        }
    }
    if let Some(b) = broken {
        give_up(l, slot, &mut recs, total, b);
        return;
    }
    for r in recs.iter_mut() {
        if !r.host.is_null() {
            sp.parked[r.idx].fetch_sub(r.size.min(sp.parked[r.idx].load(SeqCst)), SeqCst);
            r.host = std::ptr::null_mut();
        }
    }
    drop(recs);
    if let Some((region, ctx)) = REGION.lock().unwrap_or_else(|e| e.into_inner()).take() {
        let mut q = TO_FREE.lock().unwrap_or_else(|e| e.into_inner());
        q.push((region, ctx, crate::sys::now_ms()));
        PENDING_FREES.store(q.len(), Relaxed);
    }
    PHASE.store(RESIDENT, SeqCst);
    sp.phase.store(RESIDENT, SeqCst);
    let ns = fgpu_common::clock::mono_ns().saturating_sub(t0);
    // The unpark's own length: without the time it waited for room or for its limit.
    sp.last_unpark_ns
        .store(ns.saturating_sub(waited_ns), SeqCst);
    sp.unparks.fetch_add(1, SeqCst);
    touch();
    info!(
        "unparked {} ({total} bytes) in {} ms (waited for room {} ms)",
        fgpu_common::quantity::Size(total),
        ns.saturating_sub(waited_ns) / 1_000_000,
        waited_ns / 1_000_000
    );
    refresh(l);
}

/// The unpark failed for good: the process is no longer parkable, its calls go to the
/// driver unchecked, and what is still in host memory stays there (and counted as parked)
/// until it ends.
fn give_up(l: &Ledger, slot: usize, recs: &mut [Rec], back: u64, b: Broken) {
    let sp = l.slot_park(slot);
    let mut left = [0u64; fgpu_common::ledger::MAX_DEVICES];
    for r in recs.iter_mut() {
        if r.handle == 0 {
            left[r.idx] += r.size;
        }
    }
    for (p, v) in sp.parked.iter().zip(left) {
        p.store(v, SeqCst);
    }
    BROKEN.store(true, SeqCst);
    PARKABLE.store(false, SeqCst);
    PHASE.store(PARKED, SeqCst);
    sp.phase.store(PARKED, SeqCst);
    crate::log::error!(
        "unparking failed: {} answered {} {BROKEN_TRIES} times (the context is broken or the device faulted); {} brought back, {} left in host memory; this process is no longer parked or parkable, and its calls get the driver's own answers",
        b.call,
        b.rc,
        fgpu_common::quantity::Size(back),
        fgpu_common::quantity::Size(left.iter().sum())
    );
}
