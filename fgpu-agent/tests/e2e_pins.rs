//! The agent over kernel state pinned by another build (an upgrade, a downgrade, a stale test
//! directory): it must start with fresh maps and say so, not stop on a verifier log.
//! Privileged: real eBPF, bpffs.

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use common::{Agent, Cgroup, Load, SimState, privileged, unique};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_MAP_TYPE_HASH: u32 = 1;

/// `bpf(2)` with a zeroed attribute buffer whose first words are `words`.
fn bpf(cmd: libc::c_long, words: &[u64]) -> i64 {
    let mut attr = [0u64; 16];
    attr[..words.len()].copy_from_slice(words);
    // SAFETY: bpf(2) with a valid, zero-padded attribute buffer of 128 bytes; it reads it only.
    unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of_val(&attr),
        )
    }
}

/// Pins, at `path`, a hash map with 4-byte keys and values: no map of fgpu's has that shape.
fn pin_foreign_map(path: &Path) {
    // BPF_MAP_CREATE: map_type | key_size << 32, value_size | max_entries << 32.
    let fd = bpf(
        BPF_MAP_CREATE,
        &[u64::from(BPF_MAP_TYPE_HASH) | 4 << 32, 4 | 16 << 32],
    );
    assert!(
        fd >= 0,
        "BPF_MAP_CREATE: {}",
        std::io::Error::last_os_error()
    );
    let name = CString::new(path.as_os_str().as_bytes()).unwrap();
    // BPF_OBJ_PIN: pathname, bpf_fd.
    let rc = bpf(BPF_OBJ_PIN, &[name.as_ptr() as u64, fd as u64]);
    assert_eq!(
        rc,
        0,
        "BPF_OBJ_PIN {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    // SAFETY: closing the descriptor bpf(2) returned to us; the pin keeps the map.
    unsafe { libc::close(fd as i32) };
}

#[test]
fn privileged_an_agent_over_maps_pinned_by_another_build_starts_fresh_and_says_so() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let (state_dir, bpf_dir) = (agent.state_dir.clone(), agent.bpf_dir.clone());
    // The agent dies and leaves its pinned state; another build's map takes one of the names.
    agent.crash();
    for name in ["counters", "tenants"] {
        let path = bpf_dir.join(name);
        let _ = std::fs::remove_file(&path);
        pin_foreign_map(&path);
    }
    let agent = Agent::start_in(&state_dir, &[]);
    let log = agent.log_text();
    assert!(
        log.contains("do not fit this build") && log.contains("starting with fresh"),
        "the agent did not say it started over:\n{log}"
    );
    // And it works: an allocation is attributed to the byte.
    let state = SimState::new();
    let cg = Cgroup::new(&unique("fgpu-e2e-pins"));
    let mut load = Load::spawn(&cg, &state.0, &["alloc", "96MiB", "hold"]);
    load.expect_line("ready");
    agent.wait_for(
        &cg,
        "96 MiB attributed after the fresh start",
        Duration::from_secs(5),
        |s| s.is_some_and(|s| s["memory_used_bytes"] == 96u64 << 20),
    );
    load.kill();
}
