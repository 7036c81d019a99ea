//! Where a ledger comes from, decided at the first need of it ([`open`]):
//!
//! 1. the fgpu agent's ledger for the process's cgroup ([`crate::agent_link`]): limits
//!    read-only, usage shared read-write;
//! 2. no agent, and an environment limit: the standalone file `$FGPU_LEDGER`, default
//!    `/dev/shm/fgpu-ledger-<uid>` (a container's /dev/shm is its own), with one warning.
//!    Created race-free: built under a temporary name, `link(2)`ed into place; a loser of the
//!    race opens the winner's file. No global lock, at start-up or ever;
//! 3. no agent, `FGPU_AGENT=required`: a private ledger whose limits are 0 (every allocation
//!    is denied) until the agent answers;
//! 4. no agent, no environment limit: none; the shim stays inert.
//!
//! If the file cannot be used (no /dev/shm, a foreign file) the process falls back to a
//! private ledger in a memfd (limits then hold per process and fork tree) with one error.
//! This module only finds and maps a ledger; [`super::view`] claims a slot in it and
//! publishes it.

use crate::agent_link::{self, HelloError};
use crate::config;
use crate::log::{error, info, warning};
use fgpu_common::ledger::{LEDGER_SIZE, Ledger};
use std::ffi::CString;
use std::sync::atomic::Ordering::SeqCst;

/// Where the ledger in use came from: a standalone file (or a private fallback).
pub const SRC_FILE: u8 = 0;
/// The agent's ledger.
pub const SRC_AGENT: u8 = 1;
/// `FGPU_AGENT=required` without an agent: a private ledger with limits of 0.
pub const SRC_DENY: u8 = 2;

/// What [`open`] found.
pub enum Opened {
    /// A mapped ledger (`map`), this process's own open file description of it (`fd`, where
    /// its slot lock will live) and where it came from (`SRC_*`).
    Ledger { map: usize, fd: i32, source: u8 },
    /// None could be had (logged): memory limits are not enforced.
    Failed,
    /// Neither an agent nor an environment limit: nothing to enforce.
    Inert,
}

/// The ledger mapped at `map`.
pub fn ledger_at(map: usize) -> &'static Ledger {
    // SAFETY: only called with validated mappings of LEDGER_SIZE bytes that are never
    // unmapped.
    unsafe { &*(map as *const Ledger) }
}

fn map(fd: i32) -> Option<usize> {
    // SAFETY: mapping LEDGER_SIZE bytes of a file at least that large, shared.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            LEDGER_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as usize)
}

fn file_size(fd: i32) -> i64 {
    // SAFETY: stat is plain data; fstat writes it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor and out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return -1;
    }
    st.st_size
}

/// Creates a complete ledger under a temporary name and links it into place.
fn create(path: &str, mode: libc::mode_t) {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let nonce = fgpu_common::clock::mono_ns() % 1_000_000_000;
    let Ok(tmp) = CString::new(format!("{path}.tmp.{pid}.{nonce}")) else {
        return;
    };
    let Ok(cpath) = CString::new(path) else {
        return;
    };
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC;
    // SAFETY: valid path.
    let fd = unsafe { libc::open(tmp.as_ptr(), flags, mode as libc::c_uint) };
    if fd < 0 {
        return;
    }
    // SAFETY: our fresh descriptor.
    let sized = unsafe {
        libc::fchmod(fd, mode) == 0 && libc::ftruncate(fd, LEDGER_SIZE as libc::off_t) == 0
    };
    if sized && let Some(p) = map(fd) {
        // SAFETY: a fresh, zero-filled mapping of a whole Ledger.
        unsafe { &*(p as *const Ledger) }.init();
        // SAFETY: unmapping what we mapped; linking our complete file into place (fails
        // harmlessly with EEXIST if another process won the race).
        unsafe {
            libc::munmap(p as *mut libc::c_void, LEDGER_SIZE);
            libc::link(tmp.as_ptr(), cpath.as_ptr());
        }
    }
    // SAFETY: removing our temporary name and closing our descriptor.
    unsafe {
        libc::unlink(tmp.as_ptr());
        libc::close(fd);
    }
}

/// Opens (creating if needed) and maps the shared file; returns the descriptor and mapping.
pub fn open_shared(path: &str, mode: libc::mode_t) -> Result<(i32, usize), String> {
    let cpath = CString::new(path).map_err(|_| "path contains a NUL byte".to_string())?;
    for _ in 0..100 {
        // SAFETY: valid path.
        let fd = unsafe { libc::open(cpath.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::ENOENT) {
                return Err(err.to_string());
            }
            create(path, mode);
            continue;
        }
        let size = file_size(fd);
        let mapped = if size >= LEDGER_SIZE as i64 {
            map(fd)
        } else {
            None
        };
        let Some(p) = mapped else {
            // SAFETY: closing the descriptor we opened.
            unsafe { libc::close(fd) };
            return Err(format!(
                "size {size}, expected {LEDGER_SIZE} (a ledger of another version?)"
            ));
        };
        // SAFETY: a mapping of LEDGER_SIZE bytes.
        if let Err(e) = unsafe { &*(p as *const Ledger) }.validate() {
            // SAFETY: undoing our mapping and descriptor.
            unsafe {
                libc::munmap(p as *mut libc::c_void, LEDGER_SIZE);
                libc::close(fd);
            }
            return Err(e.to_string());
        }
        return Ok((fd, p));
    }
    Err("could not create it".into())
}

/// A ledger only this process (and its fork children) see.
fn open_private() -> Option<(i32, usize)> {
    // SAFETY: valid name; a fresh anonymous file.
    let fd = unsafe { libc::memfd_create(c"fgpu-ledger".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: our fresh descriptor.
    if unsafe { libc::ftruncate(fd, LEDGER_SIZE as libc::off_t) } != 0 {
        // SAFETY: closing it.
        unsafe { libc::close(fd) };
        return None;
    }
    let p = map(fd)?;
    // SAFETY: fresh zero-filled mapping of a whole Ledger.
    unsafe { &*(p as *const Ledger) }.init();
    Some((fd, p))
}

/// Finds the ledger this process uses: the agent's, a standalone file, a private one, or none.
pub fn open() -> Opened {
    let cfg = config::get();
    let err = match agent_link::first_contact() {
        Ok((map, fd, cgroup)) => {
            info!(
                "ledger of cgroup {cgroup} from the fgpu agent at {}",
                cfg.socket
            );
            return Opened::Ledger {
                map,
                fd,
                source: SRC_AGENT,
            };
        }
        Err(e) => e,
    };
    let sock = &cfg.socket;
    if cfg.agent_required {
        error!(
            "FGPU_AGENT=required, but {err} at {sock}: every GPU allocation is denied until it \
             answers"
        );
        let Some((fd, p)) = open_private() else {
            error!("no ledger at all: memory limits are not enforced");
            return Opened::Failed;
        };
        for d in &ledger_at(p).limits.devices {
            d.memory_limit.store(0, SeqCst);
        }
        agent_link::want_reconnect();
        return Opened::Ledger {
            map: p,
            fd,
            source: SRC_DENY,
        };
    }
    if cfg.env_limited {
        let vars = cfg.env_vars();
        match err {
            HelloError::NoAgent(_) => warning!("no fgpu agent at {sock}: enforcing {vars} only"),
            other => warning!("{other} (at {sock}): enforcing {vars} only"),
        }
        return open_standalone();
    }
    match err {
        HelloError::NoAgent(e) => {
            info!("no fgpu agent at {sock} ({e}) and no limit in the environment: nothing enforced")
        }
        other => warning!("{other} (at {sock}): no GPU memory limit is enforced"),
    }
    Opened::Inert
}

fn open_standalone() -> Opened {
    let cfg = config::get();
    let mode = if cfg.ledger_explicit { 0o666 } else { 0o600 };
    let (fd, p) = match open_shared(&cfg.ledger_path, mode) {
        Ok(x) => x,
        Err(e) => {
            error!(
                "ledger {} unusable ({e}): limits hold per process only",
                cfg.ledger_path
            );
            match open_private() {
                Some(x) => x,
                None => {
                    error!("no ledger at all: memory limits are not enforced");
                    return Opened::Failed;
                }
            }
        }
    };
    Opened::Ledger {
        map: p,
        fd,
        source: SRC_FILE,
    }
}
