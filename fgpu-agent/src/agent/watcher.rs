//! Keeping the probes attached to every driver library in use on the host.
//!
//! Libraries installed on the host are attached at start. Containers bring their own copies
//! (CUDA forward-compatibility libraries inside images): those are found in the maps of the
//! processes that load them. Every exec (reported by the kernel) schedules a few looks at
//! the new process's maps over its first seconds, since libraries are often `dlopen`ed
//! after start; a full scan of `/proc` every [`FULL_SCAN`] catches anything else.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use fgpu_common::event::Driver;

use super::discovery::{self, Dedup};
use super::probes::Probes;

/// How often every process's maps are scanned.
pub const FULL_SCAN: Duration = Duration::from_secs(10);
/// When, after an exec, the new process's maps are looked at.
const AFTER_EXEC: [Duration; 3] = [
    Duration::from_millis(100),
    Duration::from_millis(700),
    Duration::from_secs(3),
];

pub struct Watcher {
    probes: Probes,
    dedup: Dedup,
    /// Paths of the attached libraries, shared with the status report.
    libraries: Arc<Mutex<Vec<String>>>,
}

impl Watcher {
    pub fn new(probes: Probes, libraries: Arc<Mutex<Vec<String>>>) -> Self {
        Self {
            probes,
            dedup: Dedup::default(),
            libraries,
        }
    }

    /// Attaches to `path` unless its inode is already probed. Returns whether it attached.
    pub fn consider(&mut self, path: &Path, driver: Driver) -> Result<bool> {
        let Some(lib) = self.dedup.admit(path, driver) else {
            return Ok(false);
        };
        let shown = lib.path.display().to_string();
        self.probes.attach_library(lib)?;
        self.libraries.lock().expect("libraries lock").push(shown);
        Ok(true)
    }

    /// Like [`consider`](Self::consider), but a library that cannot be probed is logged and
    /// skipped (a process's private copy must not stop the agent).
    fn consider_logged(&mut self, path: &Path, driver: Driver) {
        if let Err(err) = self.consider(path, driver) {
            tracing::warn!("not probing {}: {err:#}", path.display());
        }
    }

    /// Detaches the previous agent's probes (this one's are attached by now).
    pub fn retire_previous(&mut self) {
        self.probes.retire_previous();
    }

    pub fn attached(&self) -> usize {
        self.probes.attached.len()
    }

    pub fn scan_all(&mut self) {
        for (path, driver) in discovery::mapped_by_all() {
            self.consider_logged(&path, driver);
        }
    }

    fn scan_pid(&mut self, pid: u32) {
        for (path, driver) in discovery::mapped_by(pid) {
            self.consider_logged(&path, driver);
        }
    }

    /// Runs until the sender side of `execs` is dropped.
    pub fn run(mut self, execs: Receiver<u32>) {
        let mut pending: Vec<(Instant, u32)> = Vec::new();
        let mut next_full = Instant::now() + FULL_SCAN;
        loop {
            let now = Instant::now();
            let wake = pending
                .iter()
                .map(|(t, _)| *t)
                .min()
                .unwrap_or(next_full)
                .min(next_full);
            match execs.recv_timeout(wake.saturating_duration_since(now)) {
                Ok(pid) => pending.extend(AFTER_EXEC.iter().map(|d| (Instant::now() + *d, pid))),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            let now = Instant::now();
            let due: Vec<u32> = pending
                .iter()
                .filter(|(t, _)| *t <= now)
                .map(|(_, p)| *p)
                .collect();
            pending.retain(|(t, _)| *t > now);
            for pid in due {
                self.scan_pid(pid);
            }
            if now >= next_full {
                self.scan_all();
                next_full = now + FULL_SCAN;
            }
        }
    }
}

/// Paths given on the command line are the operator's intent: check them up front.
pub fn explicit(paths: &[PathBuf]) -> Result<Vec<(PathBuf, Driver)>> {
    paths
        .iter()
        .map(|p| {
            if !p.is_file() {
                anyhow::bail!("--libcuda {}: no such file", p.display());
            }
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            Ok((
                p.clone(),
                Driver::of_file_name(&name).unwrap_or(Driver::Cuda),
            ))
        })
        .collect()
}
