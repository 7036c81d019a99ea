//! The shim's environment, read once, at the first CUDA or NVML call that needs it (never in
//! a process that does not touch the GPU).
//!
//! - `FGPU_MEMORY_LIMIT`: `SIZE` (every device), or a comma list of `ORDINAL:SIZE` entries with
//!   at most one plain `SIZE` as the default for devices not listed, e.g. `0:8GiB,1:4GiB` or
//!   `8GiB,1:4GiB`. Ordinals are CUDA device ordinals as the process sees them (after
//!   `CUDA_VISIBLE_DEVICES`).
//! - `GPU_MEM_LIMIT_GB=N`: compatibility; N GiB (binary, decimals allowed) for every device. When
//!   both are set the smaller limit applies per device.
//! - `FGPU_SOCKET`: the fgpu agent's socket (default `/run/fgpu/fgpu.sock`). With an agent
//!   the limits come from it; the variables above can only lower them, per device.
//! - `FGPU_AGENT=required`: without an agent (after trying for 10 s) deny every GPU
//!   allocation instead of falling back to the environment's limit.
//! - `FGPU_LEDGER`: path of the standalone ledger file (default `/dev/shm/fgpu-ledger-<uid>`).
//! - `FGPU_CONTEXT_OVERHEAD=SIZE`: charge this per process and device for the CUDA context
//!   instead of measuring it.
//! - `FGPU_LOG`: see [`crate::log`].
//!
//! A value that cannot be read is ignored with one error line on stderr (the variable then
//! sets no limit); `0` is a valid limit that denies every allocation (warned about). See
//! docs/shim.md.

use crate::log::{self, Level, error, warning};
use fgpu_common::ledger::NO_LIMIT;
use fgpu_common::quantity::{Size, parse_size};
use std::sync::OnceLock;

/// CUDA device ordinals the shim keeps per-device state for.
pub const MAX_ORDINALS: usize = 64;

pub struct Config {
    /// The environment sets some limit (standalone mode enforces it; under an agent it can
    /// lower the agent's).
    pub env_limited: bool,
    /// Which of FGPU_MEMORY_LIMIT / GPU_MEM_LIMIT_GB set a limit (for messages).
    env_vars: &'static str,
    /// The agent's socket.
    pub socket: String,
    /// FGPU_AGENT=required: fail closed without an agent.
    pub agent_required: bool,
    default_limit: u64,
    per_device: [u64; MAX_ORDINALS],
    pub ledger_path: String,
    /// FGPU_LEDGER was given (the file is then created group/world-shareable).
    pub ledger_explicit: bool,
    pub context_overhead: Option<u64>,
    /// CUDA_VISIBLE_DEVICES entries, if set.
    pub visible: Option<Vec<String>>,
}

impl Config {
    /// The environment variables that set a limit, for messages.
    pub fn env_vars(&self) -> &'static str {
        self.env_vars
    }

    /// The configured limit for CUDA ordinal `ord` (NO_LIMIT if none).
    pub fn limit_for_ordinal(&self, ord: usize) -> u64 {
        match self.per_device.get(ord) {
            Some(&l) if l != NO_LIMIT => l,
            _ => self.default_limit,
        }
    }

    /// The CUDA ordinal of the NVML device with `index` and `uuid`, following
    /// CUDA_VISIBLE_DEVICES (numbers are NVML indices, `GPU-...` entries UUID prefixes).
    pub fn ordinal_for_nvml(&self, index: u32, uuid: &str) -> Option<usize> {
        let Some(list) = &self.visible else {
            return Some(index as usize);
        };
        list.iter().position(|e| {
            let e = e.trim();
            match e.parse::<u32>() {
                Ok(n) => n == index,
                Err(_) => {
                    e.len() >= 5 && uuid.len() >= e.len() && uuid[..e.len()].eq_ignore_ascii_case(e)
                }
            }
        })
    }

    /// The limit for an NVML device (by its index and UUID string).
    pub fn limit_for_nvml(&self, index: u32, uuid: &str) -> u64 {
        match self.ordinal_for_nvml(index, uuid) {
            Some(o) => self.limit_for_ordinal(o),
            None => self.default_limit,
        }
    }
}

static CONFIG: OnceLock<Config> = OnceLock::new();

pub fn get() -> &'static Config {
    CONFIG.get_or_init(read)
}

/// The agent's socket unless FGPU_SOCKET says otherwise.
pub const DEFAULT_SOCKET: &str = "/run/fgpu/fgpu.sock";

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn read() -> Config {
    if let Some(v) = env("FGPU_LOG") {
        match Level::parse(&v) {
            Some(l) => log::set_level(l),
            None => error!("FGPU_LOG={v} is not one of error, warn, info, debug, off: using warn"),
        }
    }
    let mut default_limit = NO_LIMIT;
    let mut per_device = [NO_LIMIT; MAX_ORDINALS];
    let (mut by_fgpu, mut by_compat) = (false, false);
    if let Some(v) = env("FGPU_MEMORY_LIMIT") {
        match parse_limits(&v) {
            Ok((d, p)) => {
                default_limit = d;
                per_device = p;
                by_fgpu = true;
            }
            Err(e) => error!("FGPU_MEMORY_LIMIT={v} ignored (no limit from it): {e}"),
        }
    }
    if let Some(v) = env("GPU_MEM_LIMIT_GB") {
        match parse_gb(&v) {
            Ok(compat) => {
                by_compat = true;
                default_limit = default_limit.min(compat);
                for l in per_device.iter_mut().filter(|l| **l != NO_LIMIT) {
                    *l = (*l).min(compat);
                }
            }
            Err(e) => error!("GPU_MEM_LIMIT_GB={v} ignored (no limit from it): {e}"),
        }
    }
    let env_limited = default_limit != NO_LIMIT || per_device.iter().any(|&l| l != NO_LIMIT);
    let env_vars = match (by_fgpu, by_compat) {
        (true, true) => "FGPU_MEMORY_LIMIT and GPU_MEM_LIMIT_GB",
        (false, true) => "GPU_MEM_LIMIT_GB",
        _ => "FGPU_MEMORY_LIMIT",
    };
    let socket = env("FGPU_SOCKET").unwrap_or_else(|| DEFAULT_SOCKET.to_string());
    let agent_required = match env("FGPU_AGENT") {
        None => false,
        Some(v) => match v.trim().to_ascii_lowercase().as_str() {
            "required" => true,
            "auto" => false,
            _ => {
                error!("FGPU_AGENT={v} is not 'required' or 'auto': using auto");
                false
            }
        },
    };
    if default_limit == 0 || per_device.contains(&0) {
        warning!("a GPU memory limit of 0 is set: every GPU allocation will be denied");
    }
    let context_overhead = env("FGPU_CONTEXT_OVERHEAD").and_then(|v| match parse_size(&v) {
        Ok(n) => Some(n),
        Err(e) => {
            error!("FGPU_CONTEXT_OVERHEAD={v} ignored (overhead is measured): {e}");
            None
        }
    });
    let explicit = env("FGPU_LEDGER");
    let ledger_explicit = explicit.is_some();
    let ledger_path = explicit.unwrap_or_else(|| {
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        format!("/dev/shm/fgpu-ledger-{uid}")
    });
    let visible = std::env::var("CUDA_VISIBLE_DEVICES")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    if env_limited {
        log::info!(
            "environment memory limit {} ({} device entries); standalone ledger {ledger_path}",
            if default_limit == NO_LIMIT {
                "per device".to_string()
            } else {
                Size(default_limit).to_string()
            },
            per_device.iter().filter(|&&l| l != NO_LIMIT).count()
        );
    }
    Config {
        env_limited,
        env_vars,
        socket,
        agent_required,
        default_limit,
        per_device,
        ledger_path,
        ledger_explicit,
        context_overhead,
        visible,
    }
}

/// `SIZE` or `[SIZE,]ORD:SIZE,...` → (default, per ordinal).
pub fn parse_limits(v: &str) -> Result<(u64, [u64; MAX_ORDINALS]), String> {
    let mut default = NO_LIMIT;
    let mut per = [NO_LIMIT; MAX_ORDINALS];
    let mut seen_default = false;
    for entry in v.split(',').map(str::trim) {
        if entry.is_empty() {
            return Err("empty entry in the list".into());
        }
        match entry.split_once(':') {
            Some((ord, size)) => {
                let o: usize = ord
                    .trim()
                    .parse()
                    .ok()
                    .filter(|&o| o < MAX_ORDINALS)
                    .ok_or_else(|| {
                        format!("'{ord}' is not a device ordinal (0-{})", MAX_ORDINALS - 1)
                    })?;
                if per[o] != NO_LIMIT {
                    return Err(format!("device {o} is listed twice"));
                }
                per[o] = parse_size(size).map_err(|e| e.to_string())?;
            }
            None => {
                if seen_default {
                    return Err("more than one limit without a device ordinal".into());
                }
                seen_default = true;
                default = parse_size(entry).map_err(|e| e.to_string())?;
            }
        }
    }
    Ok((default, per))
}

/// `GPU_MEM_LIMIT_GB=N`: N GiB, N a plain non-negative number.
pub fn parse_gb(v: &str) -> Result<u64, String> {
    let t = v.trim();
    if t.is_empty() || !t.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(format!(
            "'{t}' is not a number of GiB (expected e.g. 8 or 7.5)"
        ));
    }
    parse_size(&format!("{t}GiB")).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_lists() {
        let (d, p) = parse_limits("8GiB").unwrap();
        assert_eq!(d, 8 << 30);
        assert!(p.iter().all(|&l| l == NO_LIMIT));
        let (d, p) = parse_limits("0:8GiB, 1:4GiB").unwrap();
        assert_eq!(d, NO_LIMIT);
        assert_eq!((p[0], p[1], p[2]), (8 << 30, 4 << 30, NO_LIMIT));
        let (d, p) = parse_limits("2GiB,3:1GiB").unwrap();
        assert_eq!((d, p[3]), (2 << 30, 1 << 30));
        assert!(parse_limits("banana").is_err());
        assert!(parse_limits("-1").is_err());
        assert!(parse_limits("x:1GiB").is_err());
        assert!(parse_limits("1GiB,2GiB").is_err());
        assert!(parse_limits("0:1GiB,0:2GiB").is_err());
        assert!(parse_limits("99:1GiB").is_err());
        assert_eq!(parse_limits("0").unwrap().0, 0);
    }

    #[test]
    fn compat_gb() {
        assert_eq!(parse_gb("8"), Ok(8 << 30));
        assert_eq!(parse_gb("1.5"), Ok(3 << 29));
        assert!(parse_gb("-1").is_err());
        assert!(parse_gb("8GiB").is_err());
    }

    #[test]
    fn nvml_ordinals_follow_visible_devices() {
        let mut c = Config {
            env_limited: true,
            env_vars: "FGPU_MEMORY_LIMIT",
            socket: String::new(),
            agent_required: false,
            default_limit: NO_LIMIT,
            per_device: [NO_LIMIT; MAX_ORDINALS],
            ledger_path: String::new(),
            ledger_explicit: false,
            context_overhead: None,
            visible: None,
        };
        c.per_device[0] = 8;
        c.per_device[1] = 4;
        assert_eq!(c.limit_for_nvml(1, "GPU-b"), 4);
        c.visible = Some(vec!["3".into(), "GPU-abcd".into()]);
        assert_eq!(c.limit_for_nvml(3, "GPU-x"), 8);
        assert_eq!(c.limit_for_nvml(0, "GPU-abcdef12"), 4);
        assert_eq!(c.limit_for_nvml(1, "GPU-zz"), NO_LIMIT);
    }
}
