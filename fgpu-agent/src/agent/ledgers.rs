//! The per-cgroup ledgers the agent hands to shims (DESIGN.md section 5).
//!
//! Each ledger is two memfds mapped back to back into the agent: the `Limits` page, which
//! the agent writes and seals with `F_SEAL_FUTURE_WRITE` before handing it out (so shims can
//! map it read-only and nothing else), and the `Usage` page plus process slots, shared
//! read-write. See `fgpu_common::proto::shim` for the hand-over.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};
use fgpu_common::ledger::{
    LEDGER_SIZE, LOCK_BASE, Ledger, MAX_DEVICES, MAX_SLOTS, NO_LIMIT, PAGE, uuid_key,
};

use crate::api::Limit;

const USAGE_SIZE: usize = LEDGER_SIZE - PAGE;

/// One cgroup's ledger, mapped into the agent.
pub struct CgroupLedger {
    pub cgroup: String,
    /// The cgroup's id (inode of its directory), to match kernel totals.
    pub cgroup_id: u64,
    limits_fd: OwnedFd,
    usage_fd: OwnedFd,
    base: *mut u8,
}

// SAFETY: the mapping is shared memory accessed only through atomics (`Ledger` is made of
// them); the pointer stays valid until drop.
unsafe impl Send for CgroupLedger {}
// SAFETY: as above.
unsafe impl Sync for CgroupLedger {}

impl CgroupLedger {
    /// A fresh ledger (no usage), or one around `usage` — the usage memfd a shim kept while
    /// the agent was away — so that a restart loses no charge.
    fn new(cgroup: &str, cgroup_id: u64, usage: Option<OwnedFd>) -> Result<Self> {
        let limits_fd = memfd(c"fgpu-limits", libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)?;
        set_len(&limits_fd, PAGE)?;
        let usage_fd = match usage {
            Some(fd) => {
                let len = file_len(&fd)?;
                if len != USAGE_SIZE as u64 {
                    bail!("the usage memfd handed over is {len} bytes, expected {USAGE_SIZE}");
                }
                fd
            }
            None => {
                let fd = memfd(c"fgpu-usage", libc::MFD_CLOEXEC)?;
                set_len(&fd, USAGE_SIZE)?;
                fd
            }
        };
        let base = map_contiguous(&limits_fd, &usage_fd)?;
        let ledger = Self {
            cgroup: cgroup.to_string(),
            cgroup_id,
            limits_fd,
            usage_fd,
            base,
        };
        ledger.ledger().init();
        let seals =
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a memfd we own.
        if unsafe { libc::fcntl(ledger.limits_fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(std::io::Error::last_os_error()).context("sealing the limits memfd");
        }
        Ok(ledger)
    }

    pub fn ledger(&self) -> &Ledger {
        // SAFETY: `base` maps LEDGER_SIZE bytes laid out as `Ledger` (page-aligned) for the
        // life of self; all fields are atomics.
        unsafe { &*self.base.cast::<Ledger>() }
    }

    /// The descriptors to hand to a shim: [limits, usage].
    pub fn fds(&self) -> [RawFd; 2] {
        [self.limits_fd.as_raw_fd(), self.usage_fd.as_raw_fd()]
    }

    /// Writes the effective limit into the limits page (every device: limits are per cgroup).
    pub fn apply(&self, limit: &Limit) {
        let l = &self.ledger().limits;
        for d in &l.devices {
            d.memory_limit.store(
                limit.memory_bytes.unwrap_or(NO_LIMIT),
                std::sync::atomic::Ordering::SeqCst,
            );
            d.compute_share.store(
                u32::from(limit.compute_pct.unwrap_or(0)),
                std::sync::atomic::Ordering::SeqCst,
            );
            d.compute_cap.store(
                u32::from(limit.compute_cap_pct.unwrap_or(0)),
                std::sync::atomic::Ordering::SeqCst,
            );
        }
        // A gated device starts closed: the controller grants turns (docs/compute.md).
        let gated = |p: Option<u8>| p.is_some_and(|p| (1..100).contains(&p));
        if gated(limit.compute_pct) || gated(limit.compute_cap_pct) {
            for d in &self.ledger().usage.devices {
                let b = &d.launch_budget;
                if b.load(std::sync::atomic::Ordering::SeqCst) >= 0 {
                    b.store(-1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        }
        l.generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Writes per-device memory limits (the hierarchical budgets of [`super::budget`],
    /// indexed like the ledger's device records). Shims read the limit on every allocation,
    /// so the generation (which makes them re-read compute settings) is not bumped.
    pub fn set_memory_limits(&self, limits: &[u64; MAX_DEVICES]) {
        for (d, &v) in self.ledger().limits.devices.iter().zip(limits) {
            if d.memory_limit.load(std::sync::atomic::Ordering::SeqCst) != v {
                d.memory_limit.store(v, std::sync::atomic::Ordering::SeqCst);
            }
        }
    }

    /// Allocations the shims refused, all devices.
    pub fn denied(&self) -> u64 {
        self.ledger()
            .usage
            .devices
            .iter()
            .map(|d| d.alloc_denied.load(std::sync::atomic::Ordering::SeqCst))
            .sum()
    }

    /// Publishes the kernel's view of a device's usage for the shims to weigh.
    pub fn set_kernel_used(&self, uuid: &[u8; 16], bytes: u64) {
        let key = uuid_key(uuid);
        if let Some(d) = self
            .ledger()
            .usage
            .devices
            .iter()
            .find(|d| d.key.load(std::sync::atomic::Ordering::SeqCst) == key)
        {
            d.kernel_used
                .store(bytes, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Takes back the bytes of slots whose process died (no OFD lock on the slot's byte),
    /// so a dead process's share returns even when no shim of the cgroup runs any more.
    pub fn reclaim_dead(&self) -> u64 {
        let ledger = self.ledger();
        let mut total = 0;
        for slot in 0..MAX_SLOTS {
            if !ledger.slot_in_use(slot) {
                continue;
            }
            let start = LOCK_BASE + slot as i64;
            // Taking the slot's lock ourselves proves its owner is gone, and keeps a new
            // owner out while we reclaim.
            if lock(&self.usage_fd, start, libc::F_WRLCK) {
                total += ledger.reclaim(slot);
                lock(&self.usage_fd, start, libc::F_UNLCK);
            }
        }
        total
    }
}

impl Drop for CgroupLedger {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the range mapped in `map_contiguous`.
        unsafe { libc::munmap(self.base.cast(), LEDGER_SIZE) };
    }
}

/// All ledgers, by cgroup path.
#[derive(Default)]
pub struct Ledgers {
    by_cgroup: Mutex<HashMap<String, Arc<CgroupLedger>>>,
}

impl Ledgers {
    /// The ledger of `cgroup`, created (or adopted from `usage`) on first use, with `limit`
    /// applied when it is new.
    pub fn get_or_create(
        &self,
        cgroup: &str,
        cgroup_dir: &Path,
        mut usage: Option<OwnedFd>,
        limit: &Limit,
    ) -> Result<Arc<CgroupLedger>> {
        let mut map = self.by_cgroup.lock().expect("ledgers lock");
        if let Some(l) = map.get(cgroup) {
            return Ok(Arc::clone(l));
        }
        let cgroup_id = std::fs::metadata(cgroup_dir)
            .with_context(|| format!("cgroup {cgroup} is gone"))?
            .ino();
        // After an agent restart the cgroup's running shims still share their old usage
        // memfd; adopt it from one of them so that a process starting before they reconnect
        // joins the same count instead of a fresh one.
        let source = match (
            &usage,
            usage
                .is_none()
                .then(|| usage_memfd_in(cgroup_dir))
                .flatten(),
        ) {
            (Some(_), _) => "adopted from a reconnecting shim",
            (None, Some(found)) => {
                usage = Some(found);
                "adopted from a running process of the cgroup"
            }
            (None, None) => "created",
        };
        let ledger = Arc::new(CgroupLedger::new(cgroup, cgroup_id, usage)?);
        ledger.apply(limit);
        tracing::info!(cgroup, "ledger {source}");
        map.insert(cgroup.to_string(), Arc::clone(&ledger));
        Ok(ledger)
    }

    pub fn get(&self, cgroup: &str) -> Option<Arc<CgroupLedger>> {
        self.by_cgroup
            .lock()
            .expect("ledgers lock")
            .get(cgroup)
            .cloned()
    }

    pub fn all(&self) -> Vec<Arc<CgroupLedger>> {
        self.by_cgroup
            .lock()
            .expect("ledgers lock")
            .values()
            .cloned()
            .collect()
    }

    /// Forgets ledgers whose cgroup no longer exists (shims still holding one keep it alive).
    pub fn retain(&self, keep: impl Fn(&CgroupLedger) -> bool) {
        self.by_cgroup
            .lock()
            .expect("ledgers lock")
            .retain(|_, l| keep(l));
    }
}

/// A usage memfd held by one of the cgroup's processes (`memfd:fgpu-usage` in
/// `/proc/PID/fd`), opened as a new description of the same memory.
fn usage_memfd_in(cgroup_dir: &Path) -> Option<OwnedFd> {
    let procs = std::fs::read_to_string(cgroup_dir.join("cgroup.procs")).ok()?;
    procs.lines().find_map(|pid| {
        let fd_dir = Path::new("/proc").join(pid.trim()).join("fd");
        std::fs::read_dir(&fd_dir)
            .ok()?
            .filter_map(Result::ok)
            .find_map(|e| {
                let target = std::fs::read_link(e.path()).ok()?;
                if !target.to_string_lossy().starts_with("/memfd:fgpu-usage") {
                    return None;
                }
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(e.path())
                    .ok()?;
                let fd = OwnedFd::from(file);
                (file_len(&fd).ok()? == USAGE_SIZE as u64).then_some(fd)
            })
    })
}

/// The 16 bytes of an NVML UUID string (`GPU-5e1a0000-0000-...`).
pub fn uuid_bytes(nvml_uuid: &str) -> Option<[u8; 16]> {
    let hex: String = nvml_uuid
        .trim_start_matches("GPU-")
        .chars()
        .filter(|c| *c != '-')
        .collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn memfd(name: &std::ffi::CStr, flags: libc::c_uint) -> Result<OwnedFd> {
    // SAFETY: valid NUL-terminated name; the returned fd is owned by us.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("memfd_create");
    }
    // SAFETY: fd was just returned by the kernel and is not owned elsewhere.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn set_len(fd: &OwnedFd, len: usize) -> Result<()> {
    // SAFETY: ftruncate on our own memfd.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(std::io::Error::last_os_error()).context("sizing a ledger memfd");
    }
    Ok(())
}

fn file_len(fd: &OwnedFd) -> Result<u64> {
    // SAFETY: zeroed stat is a valid out-parameter for fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on a descriptor we own, writing into `st`.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error()).context("fstat");
    }
    Ok(st.st_size as u64)
}

/// Maps limits at offset 0 and usage right after it, read-write, as one `Ledger`.
fn map_contiguous(limits: &OwnedFd, usage: &OwnedFd) -> Result<*mut u8> {
    // SAFETY: reserving address space (PROT_NONE, anonymous), then replacing its two parts
    // with MAP_FIXED mappings of our memfds, inside the reservation only.
    unsafe {
        let base = libc::mmap(
            std::ptr::null_mut(),
            LEDGER_SIZE,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("reserving ledger space");
        }
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let flags = libc::MAP_SHARED | libc::MAP_FIXED;
        let a = libc::mmap(base, PAGE, rw, flags, limits.as_raw_fd(), 0);
        let b = libc::mmap(
            base.cast::<u8>().add(PAGE).cast(),
            USAGE_SIZE,
            rw,
            flags,
            usage.as_raw_fd(),
            0,
        );
        if a == libc::MAP_FAILED || b == libc::MAP_FAILED {
            let err = std::io::Error::last_os_error();
            libc::munmap(base, LEDGER_SIZE);
            return Err(err).context("mapping a ledger");
        }
        Ok(base.cast())
    }
}

/// Sets or clears an OFD lock on one byte; true on success.
fn lock(fd: &OwnedFd, start: i64, kind: i32) -> bool {
    // SAFETY: zeroed flock is valid; fields set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = start as _;
    fl.l_len = 1;
    // SAFETY: fcntl with a valid flock on our descriptor.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &fl) == 0 }
}

const _: () = assert!(MAX_DEVICES == 16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_uuid_strings() {
        let b = uuid_bytes("GPU-5e1a0000-0000-0000-0000-0000000000ff").unwrap();
        assert_eq!(b[0], 0x5e);
        assert_eq!(b[15], 0xff);
        assert_eq!(uuid_bytes("GPU-zz"), None);
    }

    #[test]
    fn limits_page_is_sealed_against_new_writable_mappings() {
        let l = CgroupLedger::new("/t", 1, None).unwrap();
        l.apply(&Limit {
            memory_bytes: Some(1 << 30),
            ..Limit::default()
        });
        assert_eq!(l.ledger().limit(0), 1 << 30);
        assert!(l.ledger().validate().is_ok());
        let [limits, _] = l.fds();
        // SAFETY: probing mmap on our own descriptor; unmapped if it (wrongly) succeeds.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                limits,
                0,
            )
        };
        assert_eq!(
            p,
            libc::MAP_FAILED,
            "a writable mapping of the limits page must be refused"
        );
        // SAFETY: as above, read-only.
        let r = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE,
                libc::PROT_READ,
                libc::MAP_SHARED,
                limits,
                0,
            )
        };
        assert_ne!(r, libc::MAP_FAILED);
        // SAFETY: the page just mapped.
        let seen = unsafe { &*(r as *const fgpu_common::ledger::Limits) };
        assert_eq!(
            seen.devices[0]
                .memory_limit
                .load(std::sync::atomic::Ordering::SeqCst),
            1 << 30
        );
        // The agent still updates it through its own mapping; the reader sees the change.
        l.apply(&Limit {
            memory_bytes: Some(2 << 30),
            ..Limit::default()
        });
        assert_eq!(
            seen.devices[0]
                .memory_limit
                .load(std::sync::atomic::Ordering::SeqCst),
            2 << 30
        );
        // SAFETY: unmapping our probe.
        unsafe { libc::munmap(r, PAGE) };
    }
}
