//! Configuration from the environment, read once per process.
//!
//! `FGPU_SIM_DEVICES` (default 1, at most [`crate::state::MAX_DEVICES`]), `FGPU_SIM_MEMORY`
//! (per device, default 16GiB), `FGPU_SIM_CONTEXT_OVERHEAD` (per process and device context,
//! default 300MiB), `FGPU_SIM_STATE` (shared state file, default `/dev/shm/fgpu-sim-state`).
//! Devices and memory are fixed by whichever process creates the state file.
//! `FGPU_SIM_REUSE_VA=1` (per process, read in [`crate::process`]): linear memory freed is
//! handed out again last-in first-out, as a real driver does; by default addresses never
//! repeat. `FGPU_SIM_FREE_DELAY_MS=N` (per process, read in [`crate::cuda::memory`]):
//! `cuMemFree_v2` waits N ms before it does anything (a process killed inside a free).

use crate::size::parse_size;
use crate::state::MAX_DEVICES;
use std::sync::OnceLock;

pub const DEFAULT_STATE_PATH: &str = "/dev/shm/fgpu-sim-state";

#[derive(Debug, Clone)]
pub struct Config {
    pub devices: u32,
    pub memory: u64,
    pub context_overhead: u64,
    pub state_path: String,
}

fn env_size(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| parse_size(&v))
        .unwrap_or(default)
}

pub fn get() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| Config {
        devices: std::env::var("FGPU_SIM_DEVICES")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .unwrap_or(1)
            .clamp(1, MAX_DEVICES as u32),
        memory: env_size("FGPU_SIM_MEMORY", 16 << 30),
        context_overhead: env_size("FGPU_SIM_CONTEXT_OVERHEAD", 300 << 20),
        state_path: std::env::var("FGPU_SIM_STATE")
            .ok()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| DEFAULT_STATE_PATH.to_string()),
    })
}
