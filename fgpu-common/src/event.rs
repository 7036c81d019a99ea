//! Records written by the eBPF programs, mirrored from `fgpu-ebpf/src/bpf/fgpu.h`.
//!
//! The layouts are checked at compile time against the C header's sizes and offsets; a
//! change on one side that is not made on the other fails the build.

use std::mem::{offset_of, size_of};

/// `FGPU_EV_*`: what an [`Event`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum EventKind {
    /// A successful allocation was charged.
    Alloc = 1,
    /// A successful free was credited.
    Free = 2,
    /// A process holding GPU memory exited; its bytes were released.
    Exit = 3,
    /// A process called exec: it may map a driver library soon.
    Exec = 4,
    /// An allocation took a limited cgroup (`cgroup_id`, `cgroup_bytes` its subtree total)
    /// past its limit; `result` is what the kernel did ([`action`]).
    OverLimit = 5,
    /// A tenant (`cgroup_id`) reached its bound on tracking entries; the allocation is not
    /// tracked and `result` is what the kernel did ([`action`]).
    OverBound = 6,
    /// A cgroup v2 directory (`cgroup_id`) was removed; `size`: bytes its processes still
    /// held (0: the kernel pruned every record of it at once).
    CgroupGone = 7,
    /// A cgroup v2 directory (`cgroup_id`, at level `result`) was made directly under the
    /// root or under a marked shared parent: it may be a shared parent too.
    CgroupNew = 8,
}

impl EventKind {
    pub fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            1 => Some(Self::Alloc),
            2 => Some(Self::Free),
            3 => Some(Self::Exit),
            4 => Some(Self::Exec),
            5 => Some(Self::OverLimit),
            6 => Some(Self::OverBound),
            7 => Some(Self::CgroupGone),
            8 => Some(Self::CgroupNew),
            _ => None,
        }
    }
}

/// A driver library fgpu probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Driver {
    /// NVIDIA's CUDA driver, `libcuda.so.1`.
    Cuda,
    /// AMD's HIP runtime, `libamdhip64.so.N`.
    Hip,
}

impl Driver {
    /// Whether a library file name (basename) is this driver's library.
    pub fn matches_file_name(self, name: &str) -> bool {
        match self {
            Self::Cuda => name.starts_with("libcuda.so"),
            Self::Hip => name.starts_with("libamdhip64.so"),
        }
    }

    /// The driver whose library a file name names, if any.
    pub fn of_file_name(name: &str) -> Option<Self> {
        [Self::Cuda, Self::Hip]
            .into_iter()
            .find(|d| d.matches_file_name(name))
    }
}

/// A probed driver entry point (`FGPU_API_*`), passed to the kernel as the attach cookie.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ApiId {
    CuMemAlloc = 1,
    CuMemAllocPitch = 2,
    CuMemAllocManaged = 3,
    CuMemAllocAsync = 4,
    CuMemAllocFromPoolAsync = 5,
    CuMemCreate = 6,
    CuMemFree = 16,
    CuMemFreeAsync = 17,
    CuMemRelease = 18,
    HipMalloc = 32,
    HipExtMallocWithFlags = 33,
    HipMallocManaged = 34,
    HipMallocAsync = 35,
    HipMallocFromPoolAsync = 36,
    HipMemCreate = 37,
    HipFree = 48,
    HipFreeAsync = 49,
    HipMemRelease = 50,
}

impl ApiId {
    pub const ALL: [ApiId; 18] = [
        Self::CuMemAlloc,
        Self::CuMemAllocPitch,
        Self::CuMemAllocManaged,
        Self::CuMemAllocAsync,
        Self::CuMemAllocFromPoolAsync,
        Self::CuMemCreate,
        Self::CuMemFree,
        Self::CuMemFreeAsync,
        Self::CuMemRelease,
        Self::HipMalloc,
        Self::HipExtMallocWithFlags,
        Self::HipMallocManaged,
        Self::HipMallocAsync,
        Self::HipMallocFromPoolAsync,
        Self::HipMemCreate,
        Self::HipFree,
        Self::HipFreeAsync,
        Self::HipMemRelease,
    ];

    pub fn from_raw(raw: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|a| *a as u32 == raw)
    }

    /// The library that exports this entry point.
    pub fn driver(self) -> Driver {
        if (self as u32) < 32 {
            Driver::Cuda
        } else {
            Driver::Hip
        }
    }

    /// The entry points of one driver.
    pub fn of(driver: Driver) -> impl Iterator<Item = ApiId> {
        Self::ALL.into_iter().filter(move |a| a.driver() == driver)
    }

    /// The exported symbols this entry point is reached through.
    pub fn symbols(self) -> &'static [&'static str] {
        match self {
            Self::CuMemAlloc => &["cuMemAlloc_v2"],
            Self::CuMemAllocPitch => &["cuMemAllocPitch_v2"],
            Self::CuMemAllocManaged => &["cuMemAllocManaged"],
            Self::CuMemAllocAsync => &["cuMemAllocAsync", "cuMemAllocAsync_ptsz"],
            Self::CuMemAllocFromPoolAsync => {
                &["cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"]
            }
            Self::CuMemCreate => &["cuMemCreate"],
            Self::CuMemFree => &["cuMemFree_v2"],
            Self::CuMemFreeAsync => &["cuMemFreeAsync", "cuMemFreeAsync_ptsz"],
            Self::CuMemRelease => &["cuMemRelease"],
            Self::HipMalloc => &["hipMalloc"],
            Self::HipExtMallocWithFlags => &["hipExtMallocWithFlags"],
            Self::HipMallocManaged => &["hipMallocManaged"],
            Self::HipMallocAsync => &["hipMallocAsync"],
            Self::HipMallocFromPoolAsync => &["hipMallocFromPoolAsync"],
            Self::HipMemCreate => &["hipMemCreate"],
            Self::HipFree => &["hipFree"],
            Self::HipFreeAsync => &["hipFreeAsync"],
            Self::HipMemRelease => &["hipMemRelease"],
        }
    }

    /// The name people know the entry point by.
    pub fn name(self) -> &'static str {
        self.symbols()[0]
    }
}

/// `struct fgpu_event`: one record of the `events` ring buffer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Event {
    pub ts_ns: u64,
    pub cgroup_id: u64,
    pub addr: u64,
    pub size: u64,
    pub tgid: u32,
    pub tid: u32,
    pub kind: u32,
    pub api: u32,
    pub device: u32,
    pub result: i32,
    /// The (cgroup, device) total right after this event (allocations and frees).
    pub cgroup_bytes: u64,
}

impl Event {
    /// Reads a record from ring-buffer bytes; `None` if the slice is too short.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < size_of::<Self>() {
            return None;
        }
        // SAFETY: the length was checked above, `Event` is plain old data of integers (any
        // bit pattern is valid) and `read_unaligned` makes no alignment assumption.
        Some(unsafe { bytes.as_ptr().cast::<Self>().read_unaligned() })
    }
}

/// `struct fgpu_cg_key`: key of the `cg_usage` map.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct CgroupKey {
    pub cgroup_id: u64,
    pub device: u32,
    pub pad: u32,
}

/// `struct fgpu_cg_usage`: value of the `cg_usage` map.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct CgroupUsage {
    pub bytes: u64,
    pub allocs: u64,
    pub frees: u64,
}

/// `struct fgpu_proc`: value of the `procs` map (key: tgid).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct ProcUsage {
    pub cgroup_id: u64,
    pub bytes: u64,
    /// The tenant the entry is counted against (see [`Tenant`]).
    pub tenant: u64,
}

/// `FGPU_MAX_LEVELS`: the allocating cgroup and the ancestors above it that each
/// allocation is charged to.
pub const MAX_LEVELS: usize = 16;

/// `struct fgpu_limit`: value of the `limits` map (key: cgroup id; key 0 holds the node's
/// policy for tenants without a limit in `flags`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct KernelLimit {
    /// Threshold per (cgroup, device) subtree total.
    pub bytes: u64,
    /// `FGPU_LIMIT_*`: [`KernelLimit::KILL`].
    pub flags: u32,
    pub pad: u32,
}

impl KernelLimit {
    /// SIGKILL the process whose allocation crossed (else report only).
    pub const KILL: u32 = 1;
}

/// `struct fgpu_cg_tree`: value of `cg_tree` (key: cgroup id): `anc[0]` the cgroup itself,
/// `anc[i]` its i-th ancestor, 0 past the root.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct CgroupTree {
    pub anc: [u64; MAX_LEVELS],
    /// The tenant whose `cgroups` count holds this entry.
    pub counted: u64,
    /// Non-zero once the cgroup was removed while its processes held bytes.
    pub gone: u64,
    /// The cgroup's structural tenant: from the root down, the first cgroup not marked
    /// shared (the cgroup itself when all are).
    pub structural: u64,
    /// `anc[below]` is the structural tenant ([`MAX_LEVELS`]: out of reach).
    pub below: u32,
    /// What this entry counts in its tenant's `cgroups`: itself and the cgroups between it
    /// and its structural tenant within reach, which get subtree totals too.
    pub weight: u32,
}

/// `struct fgpu_shared_path`: key of `shared_paths`, a shared parent's path from the v2
/// root, zero-padded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct SharedPath {
    pub path: [u8; SHARED_PATH_MAX],
}

/// `FGPU_SHARED_PATH_MAX`: a shared parent's path fits in one byte less.
pub const SHARED_PATH_MAX: usize = 256;
/// `FGPU_MAX_SHARED`: shared parents the kernel keeps.
pub const MAX_SHARED: usize = 4096;

impl SharedPath {
    /// The key of cgroup path `path` ("/a/b"); `None` if it does not fit.
    pub fn new(path: &str) -> Option<Self> {
        let bytes = path.as_bytes();
        if bytes.len() >= SHARED_PATH_MAX || bytes.contains(&0) {
            return None;
        }
        let mut key = Self {
            path: [0; SHARED_PATH_MAX],
        };
        key.path[..bytes.len()].copy_from_slice(bytes);
        Some(key)
    }
}

/// `struct fgpu_tenant`: value of `tenants` (key: the tenant's cgroup id).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Tenant {
    /// Live entries in `allocs`.
    pub allocs: i64,
    /// Live entries in `procs`.
    pub procs: i64,
    /// Allocations refused tracking because a bound was reached.
    pub over_bound: u64,
    /// Live entries in `cg_tree` counted against this tenant, each with its weight.
    pub cgroups: i64,
}

impl Tenant {
    /// `FGPU_TENANT_MAX_ALLOCS`.
    pub const MAX_ALLOCS: i64 = 16384;
    /// `FGPU_TENANT_MAX_PROCS`.
    pub const MAX_PROCS: i64 = 1024;
    /// `FGPU_TENANT_MAX_CGROUPS`.
    pub const MAX_CGROUPS: i64 = 1024;
    /// `FGPU_TENANTS_AT_BOUND`: tenants the shared maps hold at their bounds at once.
    pub const AT_BOUND: i64 = 16;
}

/// `FGPU_ACT_*`: what the kernel did about an over-limit or over-bound allocation (the
/// `result` of those records); a negative value is `bpf_send_signal`'s error.
pub mod action {
    pub const REPORTED: i32 = 0;
    pub const KILLED: i32 = 1;
}

/// Indexes into the `counters` array map (`FGPU_CTR_*`).
pub mod counter {
    pub const RINGBUF_DROPS: u32 = 0;
    pub const MAP_FULL: u32 = 1;
    pub const FAILED_CALLS: u32 = 2;
    pub const UNKNOWN_FREES: u32 = 3;
    pub const OVER_LIMIT: u32 = 4;
    pub const KILLED: u32 = 5;
    pub const OVER_BOUND: u32 = 6;
    pub const ARGS_LOST: u32 = 7;
    pub const ADDR_UNTRUSTED: u32 = 8;
    pub const CGROUPS_PRUNED: u32 = 9;
    pub const MAX: u32 = 16;
}

// Layout of fgpu.h, checked at compile time.
const _: () = {
    assert!(size_of::<Event>() == 64);
    assert!(offset_of!(Event, cgroup_id) == 8);
    assert!(offset_of!(Event, addr) == 16);
    assert!(offset_of!(Event, size) == 24);
    assert!(offset_of!(Event, tgid) == 32);
    assert!(offset_of!(Event, tid) == 36);
    assert!(offset_of!(Event, kind) == 40);
    assert!(offset_of!(Event, api) == 44);
    assert!(offset_of!(Event, device) == 48);
    assert!(offset_of!(Event, result) == 52);
    assert!(offset_of!(Event, cgroup_bytes) == 56);
    assert!(size_of::<CgroupKey>() == 16);
    assert!(offset_of!(CgroupKey, device) == 8);
    assert!(size_of::<CgroupUsage>() == 24);
    assert!(size_of::<ProcUsage>() == 24);
    assert!(offset_of!(ProcUsage, tenant) == 16);
    assert!(size_of::<KernelLimit>() == 16);
    assert!(offset_of!(KernelLimit, flags) == 8);
    assert!(size_of::<CgroupTree>() == 8 * MAX_LEVELS + 32);
    assert!(offset_of!(CgroupTree, counted) == 8 * MAX_LEVELS);
    assert!(offset_of!(CgroupTree, structural) == 8 * MAX_LEVELS + 16);
    assert!(offset_of!(CgroupTree, below) == 8 * MAX_LEVELS + 24);
    assert!(size_of::<SharedPath>() == 256);
    assert!(size_of::<Tenant>() == 32);
    assert!(offset_of!(Tenant, cgroups) == 24);
    assert!(offset_of!(Tenant, procs) == 8);
    assert!(offset_of!(Tenant, over_bound) == 16);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_reads_from_ring_bytes() {
        let mut raw = [0u8; 64];
        raw[8..16].copy_from_slice(&1234u64.to_ne_bytes());
        raw[24..32].copy_from_slice(&(256u64 << 20).to_ne_bytes());
        raw[32..36].copy_from_slice(&77u32.to_ne_bytes());
        raw[40..44].copy_from_slice(&1u32.to_ne_bytes());
        raw[44..48].copy_from_slice(&6u32.to_ne_bytes());
        let e = Event::from_bytes(&raw).unwrap();
        assert_eq!(e.cgroup_id, 1234);
        assert_eq!(e.size, 256 << 20);
        assert_eq!(e.tgid, 77);
        assert_eq!(EventKind::from_raw(e.kind), Some(EventKind::Alloc));
        assert_eq!(EventKind::from_raw(8), Some(EventKind::CgroupNew));
        assert_eq!(ApiId::from_raw(e.api), Some(ApiId::CuMemCreate));
        assert_eq!(Event::from_bytes(&raw[..63]), None);
    }

    #[test]
    fn driver_libraries_by_file_name() {
        assert_eq!(Driver::of_file_name("libcuda.so.1"), Some(Driver::Cuda));
        assert_eq!(
            Driver::of_file_name("libcuda.so.580.159"),
            Some(Driver::Cuda)
        );
        assert_eq!(Driver::of_file_name("libamdhip64.so.5"), Some(Driver::Hip));
        assert_eq!(Driver::of_file_name("libcudart.so.12"), None);
    }

    #[test]
    fn api_ids_match_header_numbers() {
        assert_eq!(ApiId::CuMemAlloc as u32, 1);
        assert_eq!(ApiId::CuMemFree as u32, 16);
        assert_eq!(ApiId::from_raw(18), Some(ApiId::CuMemRelease));
        assert_eq!(ApiId::from_raw(7), None);
        assert_eq!(ApiId::CuMemFreeAsync.symbols().len(), 2);
        assert_eq!(ApiId::HipMalloc as u32, 32);
        assert_eq!(ApiId::from_raw(50), Some(ApiId::HipMemRelease));
        assert_eq!(ApiId::of(Driver::Hip).count(), 9);
        assert_eq!(ApiId::of(Driver::Cuda).count(), 9);
        assert!(ApiId::of(Driver::Cuda).all(|a| a.name().starts_with("cu")));
    }
}
