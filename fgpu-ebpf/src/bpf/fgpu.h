/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Records shared by the eBPF programs (fgpu.bpf.c) and user space.
 *
 * fgpu-common/src/event.rs mirrors every struct here with #[repr(C)] and compile-time
 * size/offset assertions: change both together.
 */
#ifndef FGPU_H
#define FGPU_H

#include <linux/types.h>

/* What an event record reports. */
#define FGPU_EV_ALLOC 1 /* a successful allocation was charged */
#define FGPU_EV_FREE 2  /* a successful free was credited */
#define FGPU_EV_EXIT 3  /* a process holding GPU memory exited; its bytes were released */
#define FGPU_EV_EXEC 4  /* a process called exec: it may map a driver library soon */
#define FGPU_EV_OVER_LIMIT 5 /* an allocation took a limited cgroup (cgroup_id) past its limit */
#define FGPU_EV_OVER_BOUND 6 /* a tenant (cgroup_id) past its bound on tracking entries */
/*
 * A cgroup v2 directory was removed (cgroup_id). size: bytes its own processes still held
 * when it went (0: every record of it was pruned at once; else they are pruned when those
 * bytes are credited). Emitted for every removal, GPU user or not, so that user space can
 * forget what it cached about the cgroup without walking the hierarchy.
 */
#define FGPU_EV_CGROUP_GONE 7
/*
 * A cgroup v2 directory (cgroup_id) was made directly under the root or under a cgroup the
 * agent marked as one of the node's shared parents (`shared`); result: its level. Only
 * there: a tenant cannot make cgroups in those places, so these records come at the pace of
 * the node, never of a tenant. The agent marks the new cgroup if it is a shared parent too.
 */
#define FGPU_EV_CGROUP_NEW 8

/* `result` of OVER_LIMIT and OVER_BOUND records: what the kernel did. */
#define FGPU_ACT_REPORTED 0 /* report only (--on-exceed deny) */
#define FGPU_ACT_KILLED 1   /* SIGKILL sent to the process before the call returned */
/* A negative result is bpf_send_signal's error: the kill could not be sent. */

/*
 * Driver entry points, passed as the uprobe's attach cookie. Numbers are part of the ABI
 * with user space (fgpu-common ApiId); never reuse one.
 */
#define FGPU_API_CU_MEM_ALLOC 1          /* cuMemAlloc_v2(CUdeviceptr *, size_t) */
#define FGPU_API_CU_MEM_ALLOC_PITCH 2    /* cuMemAllocPitch_v2(CUdeviceptr *, size_t *pitch, size_t w, size_t h, uint) */
#define FGPU_API_CU_MEM_ALLOC_MANAGED 3  /* cuMemAllocManaged(CUdeviceptr *, size_t, uint) */
#define FGPU_API_CU_MEM_ALLOC_ASYNC 4    /* cuMemAllocAsync(CUdeviceptr *, size_t, CUstream) (+_ptsz) */
#define FGPU_API_CU_MEM_ALLOC_POOL 5     /* cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, pool, stream) (+_ptsz) */
#define FGPU_API_CU_MEM_CREATE 6         /* cuMemCreate(handle *, size_t, const CUmemAllocationProp *, flags) */
#define FGPU_API_CU_MEM_FREE 16          /* cuMemFree_v2(CUdeviceptr) */
#define FGPU_API_CU_MEM_FREE_ASYNC 17    /* cuMemFreeAsync(CUdeviceptr, CUstream) (+_ptsz) */
#define FGPU_API_CU_MEM_RELEASE 18       /* cuMemRelease(handle) */
/* HIP (libamdhip64): same argument shapes as their CUDA counterparts. */
#define FGPU_API_HIP_MALLOC 32                /* hipMalloc(void **, size_t) */
#define FGPU_API_HIP_EXT_MALLOC_WITH_FLAGS 33 /* hipExtMallocWithFlags(void **, size_t, uint) */
#define FGPU_API_HIP_MALLOC_MANAGED 34        /* hipMallocManaged(void **, size_t, uint) */
#define FGPU_API_HIP_MALLOC_ASYNC 35          /* hipMallocAsync(void **, size_t, stream) */
#define FGPU_API_HIP_MALLOC_FROM_POOL_ASYNC 36 /* hipMallocFromPoolAsync(void **, size_t, pool, stream) */
#define FGPU_API_HIP_MEM_CREATE 37            /* hipMemCreate(handle *, size_t, const hipMemAllocationProp *, flags) */
#define FGPU_API_HIP_FREE 48                  /* hipFree(void *) */
#define FGPU_API_HIP_FREE_ASYNC 49            /* hipFreeAsync(void *, stream) */
#define FGPU_API_HIP_MEM_RELEASE 50           /* hipMemRelease(handle) */

/* Device number used when the kernel cannot know the device (current context). */
#define FGPU_DEVICE_CURRENT 0
/*
 * Devices a (cgroup, device) key can name: 0 .. FGPU_MAX_DEVICES - 1 (a cuMemCreate on a
 * higher ordinal is charged to FGPU_DEVICE_CURRENT), so that a removed cgroup's keys can be
 * pruned by trying each.
 */
#define FGPU_MAX_DEVICES 16

/*
 * Keys of `allocs` records whose address cannot be trusted (the output slot could not be
 * read, read 0, or named an address the process still holds): FGPU_ADDR_SYNTH | a sequence
 * number. Such a record is charged like any other and released with its process; no free
 * names it. Device pointers and VMM handles never have this bit set.
 */
#define FGPU_ADDR_SYNTH (1ULL << 63)

/*
 * Row pitch the driver is assumed to round cuMemAllocPitch rows up to at least (bytes):
 * the charge is max(pitch read back, width rounded up to this) x height, so that a pitch
 * rewritten by another thread before the probe reads it cannot hide more than that.
 */
#define FGPU_PITCH_ALIGN 512
/* A pitch read back more than this above the floor is not believed (the floor is charged). */
#define FGPU_PITCH_SLACK (64 << 10)

/* One record in the `events` ring buffer. 64 bytes. */
struct fgpu_event {
	__u64 ts_ns;     /* bpf_ktime_get_ns() */
	__u64 cgroup_id; /* cgroup v2 id (inode of the cgroup directory) charged or credited */
	__u64 addr;      /* device pointer or VMM handle; 0 for EXIT */
	__u64 size;      /* bytes charged (ALLOC), credited (FREE) or released (EXIT) */
	__u32 tgid;      /* process, as seen from the initial PID namespace */
	__u32 tid;
	__u32 kind;      /* FGPU_EV_* */
	__u32 api;       /* FGPU_API_* (0 for EXIT) */
	__u32 device;
	__s32 result;    /* the driver's return code */
	__u64 cgroup_bytes; /* the (cgroup, device) total right after this event */
};

/* Key of the per-(cgroup, device) totals map `cg_usage`. */
struct fgpu_cg_key {
	__u64 cgroup_id;
	__u32 device;
	__u32 pad;
};

/* Value of `cg_usage`: updated with atomic adds only. */
struct fgpu_cg_usage {
	__u64 bytes;  /* bytes currently charged */
	__u64 allocs; /* successful allocations charged, ever */
	__u64 frees;  /* frees and exit releases credited, ever */
};

/* Value of `procs`: one entry per process that holds GPU memory (key: tgid). */
struct fgpu_proc {
	__u64 cgroup_id; /* cgroup of the process's first charged allocation */
	__u64 bytes;     /* bytes the process holds, all cgroups and devices */
	__u64 tenant;    /* the tenant its `procs` entry is counted against (see fgpu_tenant) */
};

/*
 * Ancestors charged per allocation: the allocating cgroup and up to FGPU_MAX_LEVELS - 1
 * cgroups above it (the root included when within reach). A limit on a cgroup further up
 * than that from an allocating cgroup does not see the allocation (the agent warns).
 */
#define FGPU_MAX_LEVELS 16
/* Deepest cgroup level the probe looks for (cgroup v2 nests far less in practice). */
#define FGPU_MAX_DEPTH 64

/*
 * Value of `limits` (key: cgroup id), written by the agent from its limit store. Key 0 is
 * not a cgroup: its `flags` are the node's policy for tenants without a limit (bounds).
 */
struct fgpu_limit {
	__u64 bytes; /* threshold per (cgroup, device) subtree total; past it the policy applies */
	__u32 flags; /* FGPU_LIMIT_* */
	__u32 pad;
};
#define FGPU_LIMIT_KILL 1 /* SIGKILL the process whose allocation crossed (else report only) */

/*
 * Value of `cg_tree` (key: cgroup id): the cgroup's ancestry, recorded by the probe the first
 * time the cgroup allocates (a cgroup's ancestors never change). anc[0] is the cgroup itself,
 * anc[i] its i-th ancestor; 0 past the root. Frees and exit releases credit these.
 */
struct fgpu_cg_tree {
	__u64 anc[FGPU_MAX_LEVELS];
	__u64 counted;    /* the tenant whose `cgroups` counts this entry */
	__u64 gone;       /* non-zero once the cgroup was removed while its processes held bytes */
	__u64 structural; /* the cgroup's structural tenant (below) */
	__u32 below;      /* anc[below] is the structural tenant (FGPU_MAX_LEVELS: out of reach) */
	__u32 weight;     /* what this entry counts in its tenant's `cgroups` (below) */
};

/*
 * Every cgroup belongs to a tenant, which no tenant can multiply by making cgroups:
 * - its structural tenant: walking down from the root, the first cgroup the agent has not
 *   marked as one of the node's shared parents (`shared`: systemd slices, kubepods and its
 *   QoS classes, docker, libpod_parent, machine, fgpu; never a pod or a container cgroup),
 *   or the cgroup itself when every cgroup on its way is shared. Everything a tenant can
 *   create lies below it;
 * - unless a limited cgroup lies on the way at or below the structural tenant, within reach
 *   (anc[]): then the topmost such one. A limited shared parent is no tenant (its limit still
 *   applies to the subtree total).
 *
 * Value of `tenants` (key: the tenant's cgroup id): live entries of the shared tracking maps
 * are bounded per tenant, so that no tenant can fill them and blind attribution for others;
 * past a bound the allocation is not tracked and the tenant's policy applies (OVER_BOUND
 * record, FGPU_CTR_OVER_BOUND).
 */
struct fgpu_tenant {
	__s64 allocs;     /* live entries in `allocs` */
	__s64 procs;      /* live entries in `procs` */
	__u64 over_bound; /* allocations refused tracking because a bound was reached */
	__s64 cgroups;    /* live entries in `cg_tree` counted against this tenant */
};
#define FGPU_TENANT_MAX_ALLOCS 16384
#define FGPU_TENANT_MAX_PROCS 1024
/*
 * Cgroups tracked per tenant: entries of `cg_tree`, and with them of `cg_usage` and
 * `tree_usage`. An allocating cgroup counts once for itself and once for each cgroup between
 * it and its structural tenant within reach (anc[1 .. below - 1]: each gets subtree totals
 * too, without allocating), so a tenant's subtree totals are bounded however deep it nests.
 * A cgroup removed is pruned from every map (tracepoint cgroup/cgroup_rmdir), so this bounds
 * what is alive, not what was ever seen.
 */
#define FGPU_TENANT_MAX_CGROUPS 1024
/*
 * Tenants the shared tracking maps hold at their bounds at once: each map's capacity is
 * this many times the per-tenant bound on its entries, so that a map is full only when that
 * many tenants are at their bounds (a full map kills nobody: FGPU_CTR_MAP_FULL).
 */
#define FGPU_TENANTS_AT_BOUND 16

/*
 * Shared parents the agent may mark (`shared`, `shared_paths`). Paths of marked cgroups are
 * kept up to FGPU_SHARED_PATH_MAX - 1 bytes; a cgroup with a longer path is never marked.
 */
#define FGPU_MAX_SHARED 4096
#define FGPU_SHARED_PATH_MAX 256

/* Key of `shared_paths`: a shared parent's path from the v2 root ("/a/b"), zero-padded. */
struct fgpu_shared_path {
	char path[FGPU_SHARED_PATH_MAX];
};

/* Indexes into the `counters` array map. */
#define FGPU_CTR_RINGBUF_DROPS 0 /* events that did not fit in the ring buffer */
#define FGPU_CTR_MAP_FULL 1      /* allocations that could not be tracked (map full) */
#define FGPU_CTR_FAILED_CALLS 2  /* probed calls that returned an error (nothing charged) */
#define FGPU_CTR_UNKNOWN_FREES 3 /* frees of pointers we never saw allocated */
#define FGPU_CTR_OVER_LIMIT 4    /* allocations that took a limited cgroup past its limit */
#define FGPU_CTR_KILLED 5        /* of those (and OVER_BOUND), processes the kernel SIGKILLed */
#define FGPU_CTR_OVER_BOUND 6    /* allocations past their tenant's tracking bound */
#define FGPU_CTR_ARGS_LOST 7     /* probed calls whose arguments could not be stored */
#define FGPU_CTR_ADDR_UNTRUSTED 8 /* allocations charged under FGPU_ADDR_SYNTH keys */
#define FGPU_CTR_CGROUPS_PRUNED 9 /* removed cgroups whose records were all pruned */
#define FGPU_CTR_MAX 16

#endif /* FGPU_H */
