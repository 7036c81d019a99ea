//! Keeping the kernel side running across agent restarts.
//!
//! The maps that hold state ([`PINNED_MAPS`], the limits included) and
//! every probe link are pinned under one bpffs directory (default `/sys/fs/bpf/fgpu`). When
//! the agent stops — crash, upgrade, restart — the probes stay attached and keep charging
//! and crediting into the pinned maps, so nothing allocated or freed meanwhile is missed, and
//! a process that exits meanwhile is still released. The next agent reuses the maps,
//! attaches its own links, then retires the previous agent's. While both are attached, an
//! entry stores its arguments once per thread in the shared `call_args` and the first return
//! consumes them, so nothing is counted twice.
//!
//! To take fgpu's probes out of the kernel for good: stop the agent and remove the directory.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use aya::EbpfLoader;
use aya::programs::links::FdLink;

/// Maps whose contents must outlive an agent.
/// `limits` is among them, so the kernel keeps enforcing while no agent runs.
/// So are the node's shared parents, which tell the probes who the tenants are.
pub const PINNED_MAPS: [&str; 11] = [
    "call_args",
    "allocs",
    "cg_usage",
    "procs",
    "counters",
    "tree_usage",
    "cg_tree",
    "limits",
    "tenants",
    "shared",
    "shared_paths",
];

pub struct Pins {
    pub dir: PathBuf,
    /// Tag of this agent's link pins.
    generation: String,
    next: usize,
    /// Link pins left by earlier agents, removed by [`Pins::retire_old`].
    old: Vec<PathBuf>,
}

impl Pins {
    /// Prepares `dir` (mounting bpffs on /sys/fs/bpf if nothing is mounted there).
    pub fn open(dir: &Path) -> Result<Self> {
        ensure_bpffs()?;
        if dir
            .components()
            .any(|c| c.as_os_str().to_string_lossy().contains('.'))
        {
            anyhow::bail!(
                "--bpf-dir {}: bpffs does not allow '.' in names",
                dir.display()
            );
        }
        let links = dir.join("links");
        std::fs::create_dir_all(&links).with_context(|| {
            format!("creating {} (is it on a bpf file system?)", links.display())
        })?;
        let old = std::fs::read_dir(&links)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .collect();
        let generation = format!("{}-{}", std::process::id(), unix_nanos());
        Ok(Self {
            dir: dir.to_path_buf(),
            generation,
            next: 0,
            old,
        })
    }

    /// Points the loader at the pinned maps (created on first use, reused afterwards).
    pub fn configure<'a>(&'a self, loader: &mut EbpfLoader<'a>) {
        for name in PINNED_MAPS {
            loader.map_pin_path(name, self.dir.join(name));
        }
    }

    /// Forgets pinned maps (after a layout change made them unusable).
    pub fn reset_maps(&self) {
        for name in PINNED_MAPS {
            let _ = std::fs::remove_file(self.dir.join(name));
        }
    }

    /// Whether maps from an earlier agent are there to be reused.
    pub fn has_maps(&self) -> bool {
        PINNED_MAPS.iter().any(|m| self.dir.join(m).exists())
    }

    /// Pins a link so that it outlives this agent.
    pub fn pin(&mut self, link: FdLink) -> Result<()> {
        let path = self
            .dir
            .join("links")
            .join(format!("{}-{}", self.generation, self.next));
        self.next += 1;
        link.pin(&path)
            .with_context(|| format!("pinning a probe link at {}", path.display()))?;
        Ok(())
    }

    /// Detaches the links of earlier agents (ours are attached by now).
    pub fn retire_old(&mut self) -> usize {
        let n = self.old.len();
        for path in self.old.drain(..) {
            let _ = std::fs::remove_file(path);
        }
        n
    }
}

fn unix_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// bpffs is usually mounted by systemd; mount it where libbpf tools expect it if not.
fn ensure_bpffs() -> Result<()> {
    let target = Path::new("/sys/fs/bpf");
    let mounted = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(4) == Some("/sys/fs/bpf") && l.contains(" - bpf "));
    if mounted {
        return Ok(());
    }
    std::fs::create_dir_all(target).ok();
    let fs = c"bpf";
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            fs.as_ptr(),
            c"/sys/fs/bpf".as_ptr(),
            fs.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        anyhow::bail!("bpffs is not mounted and mounting it on /sys/fs/bpf failed: {err}");
    }
    tracing::info!("mounted bpffs on /sys/fs/bpf");
    Ok(())
}
