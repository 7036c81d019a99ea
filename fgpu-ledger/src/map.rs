//! Mapping a ledger's two memfds back to back as one [`Ledger`].

use std::os::fd::RawFd;

use fgpu_common::ledger::{LEDGER_SIZE, Ledger, PAGE, USAGE_SIZE};

use crate::{Error, check_limits, check_usage};

/// Reserves the ledger's address range (no access), to be filled with MAP_FIXED mappings.
fn reserve() -> Result<usize, Error> {
    // SAFETY: a fresh anonymous reservation; nothing else refers to it.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            LEDGER_SIZE,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(Error::os("reserving the ledger's address range"));
    }
    Ok(base as usize)
}

fn unmap(base: usize) {
    // SAFETY: unmapping a range this module reserved and mapped (never memory of others).
    unsafe { libc::munmap(base as *mut libc::c_void, LEDGER_SIZE) };
}

fn map_at(addr: usize, len: usize, prot: i32, fd: RawFd, what: &'static str) -> Result<(), Error> {
    // SAFETY: replaces pages inside a range reserved by `reserve` (never memory of others).
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            prot,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::os(what));
    }
    Ok(())
}

fn map(limits: RawFd, usage: RawFd, limits_prot: i32) -> Result<usize, Error> {
    let base = reserve()?;
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let mapped =
        map_at(base, PAGE, limits_prot, limits, "mapping the limits memfd").and_then(|()| {
            map_at(
                base + PAGE,
                USAGE_SIZE,
                rw,
                usage,
                "mapping the usage memfd",
            )
        });
    if let Err(e) = mapped {
        unmap(base);
        return Err(e);
    }
    Ok(base)
}

/// The agent's mapping of a ledger: both parts read-write. Unmapped on drop.
pub struct Mapping {
    base: usize,
}

impl Mapping {
    pub fn ledger(&self) -> &Ledger {
        // SAFETY: `base` maps LEDGER_SIZE bytes laid out as `Ledger` (page-aligned) for the
        // life of self; every field is an atomic.
        unsafe { &*(self.base as *const Ledger) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        unmap(self.base);
    }
}

/// Maps `limits` (before it is sealed, or through the agent's own writable mapping) and
/// `usage` read-write, after checking that `usage` is sealed and sized as a usage memfd must
/// be. The layout is not validated (a fresh ledger is initialised through this mapping).
pub fn map_agent(limits: RawFd, usage: RawFd) -> Result<Mapping, Error> {
    check_usage(usage)?;
    let base = map(limits, usage, libc::PROT_READ | libc::PROT_WRITE)?;
    Ok(Mapping { base })
}

/// A shim's mapping: the limits page read-only (it is sealed against anything else) and the
/// usage part read-write, after checking seals and sizes; the layout (magic, version, size)
/// is validated. Returns the address (shims never unmap a ledger: threads may hold references
/// into it).
pub fn map_shim(limits: RawFd, usage: RawFd) -> Result<usize, Error> {
    check_limits(limits)?;
    check_usage(usage)?;
    let base = map(limits, usage, libc::PROT_READ)?;
    // SAFETY: LEDGER_SIZE bytes mapped at base; Ledger is all atomics.
    if let Err(e) = unsafe { &*(base as *const Ledger) }.validate() {
        unmap(base);
        return Err(e.into());
    }
    Ok(base)
}

/// Unmaps a shim mapping that was never published.
pub fn unmap_shim(base: usize) {
    unmap(base);
}

/// Replaces the limits page of the shim mapping at `base` with `limits` (checked and
/// validated in a scratch mapping first: a page swap cannot be undone).
pub fn remap_limits(base: usize, limits: RawFd, usage: RawFd) -> Result<(), Error> {
    let scratch = map_shim(limits, usage)?;
    unmap(scratch);
    map_at(
        base,
        PAGE,
        libc::PROT_READ,
        limits,
        "remapping the limits page",
    )
}
