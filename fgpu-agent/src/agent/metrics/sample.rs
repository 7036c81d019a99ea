//! Taking one [`Sample`] of the agent's state: the status report (as `fgpu status --json`
//! has it) and the node's figures the report does not carry.

use std::sync::atomic::Ordering::Relaxed;

use fgpu_common::ledger::{MAX_DEVICES, uuid_key};

use super::families::{LedgerDevice, Sample};
use crate::agent::gpus::uuid_bytes;
use crate::agent::state::State;

pub fn take(state: &State, hostname: &str, ready: bool) -> Sample {
    let report = crate::agent::report::of(state);
    let ledgers = state.ledgers().all();
    Sample {
        hostname: hostname.to_string(),
        report,
        gpus: state.devices().to_vec(),
        ledgers: ledgers.len(),
        shims: state.shims().connected(),
        ledger_devices: ledger_devices(state, &ledgers),
        switches: switches(state),
        park: state.park().snapshot(),
        ready,
    }
}

/// The gated device records of every ledger: turns granted (the agent's own page) and GPU
/// time measured (the shims' page, read as they wrote it). Records whose device key matches
/// none of the node's GPUs are left out.
fn ledger_devices(
    state: &State,
    ledgers: &[std::sync::Arc<crate::agent::ledgers::CgroupLedger>],
) -> Vec<LedgerDevice> {
    let keys = gpu_keys(state);
    let gated = |p: u32| (1..100).contains(&p);
    let mut out = Vec::new();
    for l in ledgers {
        let page = l.ledger();
        for idx in 0..MAX_DEVICES {
            let lim = &page.limits.devices[idx];
            if !(gated(lim.compute_share.load(Relaxed)) || gated(lim.compute_cap.load(Relaxed))) {
                continue;
            }
            let key = page.usage.devices[idx].key.load(Relaxed);
            let Some(&(_, gpu)) = keys.iter().find(|(k, _)| *k == key) else {
                continue;
            };
            out.push(LedgerDevice {
                ledger: l.cgroup.clone(),
                gpu,
                turns: u64::from(page.limits.turns[idx].grant.load(Relaxed)),
                gpu_time_s: page.usage.compute[idx].gpu_ns.load(Relaxed) as f64 / 1e9,
            });
        }
    }
    out
}

/// The controller's switch histograms of the node's GPUs (keys that match none are left out).
fn switches(state: &State) -> Vec<(u32, crate::agent::compute::Gaps)> {
    let keys = gpu_keys(state);
    let mut out: Vec<_> = state
        .compute()
        .switches
        .all()
        .into_iter()
        .filter_map(|(key, h)| Some((keys.iter().find(|(k, _)| *k == key)?.1, h)))
        .collect();
    out.sort_by_key(|(gpu, _)| *gpu);
    out
}

/// (uuid key, NVML index) of the node's GPUs.
fn gpu_keys(state: &State) -> Vec<(u64, u32)> {
    state
        .devices()
        .iter()
        .filter_map(|g| Some((uuid_key(&uuid_bytes(&g.uuid)?), g.index)))
        .collect()
}
