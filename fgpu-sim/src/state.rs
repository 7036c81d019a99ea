//! Device state shared by every process on the host: a file mmap'd `MAP_SHARED`, made of
//! `#[repr(C)]` records with atomics only (no lock a SIGKILLed process could leave held).
//!
//! Creation is race-free: the first process builds the whole file under a unique temporary
//! name and `link(2)`s it into place; a loser of that race simply opens the winner's file.
//!
//! Each process that creates a context claims a slot by taking an OFD write lock
//! (`F_OFD_SETLK`) on byte `LOCK_BASE + slot` of the file. The kernel drops the lock when the
//! process dies (however it dies), and `F_OFD_GETLK` from any process, in any PID namespace,
//! tells whether the slot's owner is still alive. Dead slots are simply not counted ("lazy
//! reclaim"): only the owner ever writes its slot, and a new owner resets it when claiming it.
//!
//! The pid recorded in a slot is `getpid()` as the owner sees it: inside a PID namespace this
//! is the namespace pid. Real NVML reports host pids, so the owner also takes a classic
//! (process-associated) POSIX lock on byte `PID_BASE + slot`: `F_GETLK` reports its owner's
//! pid as the *caller's* PID namespace sees it (0 where the owner is not visible there), so
//! NVML answered in the host namespace (the agent) lists host pids, as the real one does.

use crate::config::Config;
use crate::timeline::BusyRing;
use std::ffi::CString;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};

pub const MAX_DEVICES: usize = 8;
pub const MAX_SLOTS: usize = 128;
const MAGIC: u64 = 0x6667_7075_7369_6d31; // "fgpusim1"
const LOCK_BASE: i64 = 1 << 30;
const PID_BASE: i64 = 1 << 31;

#[repr(C)]
pub struct Header {
    pub magic: AtomicU64,
    pub layout_size: AtomicU64,
    pub devices: AtomicU32,
    _pad: u32,
    pub memory: AtomicU64,
    pub context_overhead: AtomicU64,
}

/// One device's timeline and busy accounting.
#[repr(C)]
pub struct DeviceRec {
    /// CLOCK_MONOTONIC ns at which the last scheduled work on this device completes.
    pub busy_until_ns: AtomicU64,
    /// Total ns of work ever scheduled.
    pub busy_total_ns: AtomicU64,
    pub busy: BusyRing,
}

/// One process's record. Written only by its owner (the holder of the slot's OFD lock).
#[repr(C)]
pub struct Slot {
    /// Nonzero once some process has claimed this slot (it may have died since).
    pub claimed: AtomicU32,
    pub pid: AtomicU32,
    /// Bit d set while the process holds a context on device d.
    pub ctx_mask: AtomicU64,
    /// Bytes charged per device, context overhead included.
    pub used: [AtomicU64; MAX_DEVICES],
    pub busy_total_ns: [AtomicU64; MAX_DEVICES],
    pub busy: [BusyRing; MAX_DEVICES],
}

#[repr(C)]
pub struct Layout {
    pub header: Header,
    pub devices: [DeviceRec; MAX_DEVICES],
    pub slots: [Slot; MAX_SLOTS],
}

/// This process's view of the shared file.
pub struct Shared {
    map: *const Layout,
    fd: libc::c_int,
    /// The slot this process claimed (`usize::MAX`: none). Our own OFD lock is invisible to
    /// `F_OFD_GETLK` through our own descriptor, so our slot is recognised by index.
    own: AtomicUsize,
}

// SAFETY: the mapping lives for the whole process and is only accessed through atomics.
unsafe impl Send for Shared {}
// SAFETY: as above; all fields of `Layout` are atomics.
unsafe impl Sync for Shared {}

static SHARED: OnceLock<Option<Shared>> = OnceLock::new();

/// Opens (creating if needed) the shared state once per process.
pub fn shared() -> Option<&'static Shared> {
    SHARED
        .get_or_init(|| Shared::open(crate::config::get()))
        .as_ref()
}

fn cpath(s: &str) -> Option<CString> {
    CString::new(s).ok()
}

impl Shared {
    fn open(cfg: &Config) -> Option<Shared> {
        let size = std::mem::size_of::<Layout>();
        let path = cpath(&cfg.state_path)?;
        for _ in 0..50 {
            // SAFETY: `path` is a valid NUL-terminated string.
            let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
            if fd >= 0 {
                if let Some(s) = Self::map_existing(fd, size) {
                    return Some(s);
                }
                // SAFETY: closing the descriptor we just opened.
                unsafe { libc::close(fd) };
                return None;
            }
            if Self::create(cfg, &path, size) {
                continue; // now open what we (or a racing winner) linked into place
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        None
    }

    fn map_existing(fd: libc::c_int, size: usize) -> Option<Shared> {
        // SAFETY: fstat on a valid descriptor into a zeroed stat buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a valid out-pointer.
        if unsafe { libc::fstat(fd, &mut st) } != 0 || (st.st_size as usize) < size {
            return None;
        }
        let map = map_fd(fd, size)?;
        // SAFETY: the mapping is at least `size` bytes and lives for the process.
        let layout = unsafe { &*map };
        if layout.header.magic.load(SeqCst) != MAGIC
            || layout.header.layout_size.load(SeqCst) != size as u64
        {
            return None;
        }
        Some(Shared {
            map,
            fd,
            own: AtomicUsize::new(usize::MAX),
        })
    }

    /// Builds a complete file under a temporary name, then links it into place. Returns true
    /// if the path now exists (ours or another creator's).
    fn create(cfg: &Config, path: &CString, size: usize) -> bool {
        let tmp = format!(
            "{}.tmp.{}.{}",
            cfg.state_path,
            std::process::id(),
            crate::timeline::now_ns()
        );
        let Some(ctmp) = cpath(&tmp) else {
            return false;
        };
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC;
        // SAFETY: valid path; creating a fresh file.
        let fd = unsafe { libc::open(ctmp.as_ptr(), flags, 0o666) };
        if fd < 0 {
            return false;
        }
        // SAFETY: fd is ours; sizes are in range.
        let ok = unsafe { libc::fchmod(fd, 0o666) == 0 && libc::ftruncate(fd, size as i64) == 0 };
        if ok && let Some(map) = map_fd(fd, size) {
            // SAFETY: freshly mapped, zero-filled file of the right size.
            let h = unsafe { &(*map).header };
            h.layout_size.store(size as u64, SeqCst);
            h.devices.store(cfg.devices, SeqCst);
            h.memory.store(cfg.memory, SeqCst);
            h.context_overhead.store(cfg.context_overhead, SeqCst);
            h.magic.store(MAGIC, SeqCst);
            // SAFETY: unmapping what we mapped above.
            unsafe { libc::munmap(map as *mut libc::c_void, size) };
            // SAFETY: both paths are valid C strings; link fails with EEXIST if we lost a race.
            unsafe { libc::link(ctmp.as_ptr(), path.as_ptr()) };
        }
        // SAFETY: removing our temporary name and closing our descriptor.
        unsafe {
            libc::unlink(ctmp.as_ptr());
            libc::close(fd);
        }
        // SAFETY: valid path.
        unsafe { libc::access(path.as_ptr(), libc::F_OK) == 0 }
    }

    pub fn layout(&self) -> &Layout {
        // SAFETY: `map` points at a live shared mapping of a full `Layout` (checked at open).
        unsafe { &*self.map }
    }

    pub fn devices(&self) -> usize {
        (self.layout().header.devices.load(SeqCst) as usize).min(MAX_DEVICES)
    }

    pub fn memory(&self) -> u64 {
        self.layout().header.memory.load(SeqCst)
    }

    pub fn context_overhead(&self) -> u64 {
        self.layout().header.context_overhead.load(SeqCst)
    }

    pub fn device(&self, dev: usize) -> &DeviceRec {
        &self.layout().devices[dev]
    }

    pub fn slot(&self, idx: usize) -> &Slot {
        &self.layout().slots[idx]
    }

    fn ofd_lock(&self, idx: usize, cmd: libc::c_int) -> Option<libc::flock> {
        self.lock_at(LOCK_BASE + idx as i64, cmd)
    }

    fn lock_at(&self, start: i64, cmd: libc::c_int) -> Option<libc::flock> {
        // SAFETY: plain-old-data struct, zero is a valid value.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as i16;
        fl.l_whence = libc::SEEK_SET as i16;
        fl.l_start = start;
        fl.l_len = 1;
        // SAFETY: fcntl with a valid descriptor and flock pointer.
        let rc = unsafe { libc::fcntl(self.fd, cmd, &mut fl) };
        (rc == 0).then_some(fl)
    }

    /// Claims a free slot for this process (its OFD lock is held until the process exits).
    pub fn claim_slot(&self) -> Option<usize> {
        let own = self.own.load(SeqCst);
        if own != usize::MAX {
            return Some(own);
        }
        let claimed = (0..MAX_SLOTS).find(|&i| {
            if self.ofd_lock(i, libc::F_OFD_SETLK).is_none() {
                return false;
            }
            let s = self.slot(i);
            for d in 0..MAX_DEVICES {
                s.used[d].store(0, SeqCst);
                s.busy_total_ns[d].store(0, SeqCst);
                s.busy[d].clear();
            }
            s.ctx_mask.store(0, SeqCst);
            s.pid.store(std::process::id(), SeqCst);
            // Best effort: without it, observers see the recorded pid.
            let _ = self.lock_at(PID_BASE + i as i64, libc::F_SETLK);
            s.claimed.store(1, SeqCst);
            true
        });
        if let Some(i) = claimed {
            self.own.store(i, SeqCst);
        }
        claimed
    }

    /// Whether slot `idx` belongs to a live process .
    pub fn is_live(&self, idx: usize) -> bool {
        if self.own.load(SeqCst) == idx {
            return true;
        }
        if self.slot(idx).claimed.load(SeqCst) == 0 {
            return false;
        }
        match self.ofd_lock(idx, libc::F_OFD_GETLK) {
            Some(fl) => fl.l_type != libc::F_UNLCK as i16,
            None => false,
        }
    }

    /// The pid of slot `idx`'s owner as this process's PID namespace sees it (NVML's pid):
    /// from its POSIX lock where the owner is visible here, else the pid it recorded.
    pub fn pid_of(&self, idx: usize) -> u32 {
        let recorded = self.slot(idx).pid.load(SeqCst);
        if self.own.load(SeqCst) == idx {
            return recorded;
        }
        match self.lock_at(PID_BASE + idx as i64, libc::F_GETLK) {
            Some(fl) if fl.l_type != libc::F_UNLCK as i16 && fl.l_pid > 0 => fl.l_pid as u32,
            _ => recorded,
        }
    }

    /// Live slots, as indices.
    pub fn live_slots(&self) -> Vec<usize> {
        (0..MAX_SLOTS).filter(|&i| self.is_live(i)).collect()
    }

    /// Bytes in use on `dev` by all live processes.
    pub fn used_on(&self, dev: usize) -> u64 {
        self.live_slots()
            .into_iter()
            .map(|i| self.slot(i).used[dev].load(SeqCst))
            .sum()
    }

    /// (free, total) of `dev`.
    pub fn mem_info(&self, dev: usize) -> (u64, u64) {
        let total = self.memory();
        (total.saturating_sub(self.used_on(dev)), total)
    }

    /// Charges `bytes` on `dev` to slot `own`, optimistically: add first, then check the sum
    /// of all live processes; back out on overflow. Concurrent chargers may both fail near
    /// the limit but can never oversubscribe the device.
    pub fn charge(&self, own: usize, dev: usize, bytes: u64) -> bool {
        let used = &self.slot(own).used[dev];
        used.fetch_add(bytes, SeqCst);
        if self.used_on(dev) > self.memory() {
            used.fetch_sub(bytes, SeqCst);
            return false;
        }
        true
    }

    pub fn uncharge(&self, own: usize, dev: usize, bytes: u64) {
        let used = &self.slot(own).used[dev];
        let _ = used.fetch_update(SeqCst, SeqCst, |u| Some(u.saturating_sub(bytes)));
    }

    /// In a child after fork: drop our copy of the descriptor so the parent's slot lock
    /// dies with the parent.
    pub fn close_in_child(&self) {
        // SAFETY: closing our own descriptor; the child never uses this `Shared` again.
        unsafe { libc::close(self.fd) };
    }
}

fn map_fd(fd: libc::c_int, size: usize) -> Option<*const Layout> {
    // SAFETY: mapping `size` bytes of a file at least that large, shared, read-write.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as *const Layout)
}

/// The shared state if this process already opened it (no side effects).
pub fn shared_if_open() -> Option<&'static Shared> {
    SHARED.get().and_then(Option::as_ref)
}
