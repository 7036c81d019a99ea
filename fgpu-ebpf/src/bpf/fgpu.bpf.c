// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * fgpu's kernel side: charge every successful GPU allocation to the cgroup that made it.
 *
 * One entry program and one return program serve every probed driver entry point; the
 * attach cookie tells which entry point fired (FGPU_API_* in fgpu.h). The entry program
 * stores the raw arguments keyed by thread; the return program reads the result and, on
 * success only, charges or credits. Storing by thread makes a second attachment of the
 * same code harmless (the entry overwrites, the first return consumes).
 *
 * State kept here (user space reads it; the agent writes `limits` only):
 *   allocs     (tgid, pointer or VMM handle) -> (size, cgroup, device, tenant)
 *   cg_usage   (cgroup, device) -> bytes held by the cgroup's own processes, allocs, frees
 *   tree_usage (cgroup, device) -> bytes held by the cgroup and all its descendants
 *   cg_tree    cgroup -> its ancestry (struct fgpu_cg_tree)
 *   limits     cgroup -> threshold and policy (struct fgpu_limit), written by the agent
 *   tenants    tenant -> live tracking entries (struct fgpu_tenant)
 *   procs      tgid -> cgroup, bytes held, tenant; a group leader's exit releases the process
 *   counters   drops and anomalies, never silent
 *   events     ring buffer of struct fgpu_event for the agent
 *
 * The backstop is synchronous: the return probe charges every ancestor of the allocating
 * cgroup, and when a successful allocation takes a limited one past its threshold it sends
 * SIGKILL to the process (policy FGPU_LIMIT_KILL) before the call returns to it, so the
 * allocation is never used, whatever the agent is doing; it reports it either way
 * (FGPU_EV_OVER_LIMIT). The memory is released by the exit tracepoint as for any process.
 *
 * Process exec is reported too (FGPU_EV_EXEC), so the agent can look for driver libraries
 * (a container's own copy of libcuda) in new processes soon after they start.
 */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "fgpu.h"

char LICENSE[] SEC("license") = "GPL";

/*
 * CUmemAllocationProp and hipMemAllocationProp share this layout: location.type at byte 8,
 * location.id at byte 12; type 1 is a device in both.
 */
#define CU_MEM_PROP_LOCATION_TYPE_OFF 8
#define CU_MEM_PROP_LOCATION_ID_OFF 12
#define CU_MEM_LOCATION_TYPE_DEVICE 1

struct alloc_key {
	__u32 tgid;
	__u32 pad;
	__u64 addr;
};

struct alloc_val {
	__u64 size;
	__u64 cgroup_id;
	__u64 tenant;
	__u32 device;
	__u32 pad;
};

/* What a free's entry did with its pointer's record (call_args.freed; 0: not a free). */
#define FREE_TAKEN 1    /* taken out of `allocs` into call_args.rec */
#define FREE_UNSEEN 2   /* no record: an unknown free */

struct call_args {
	__u64 api;
	__u64 a0, a1, a2, a3;
	__u64 freed;
	/*
	 * A free takes its record out of `allocs` at entry, while the driver still holds the
	 * memory (so nobody can be handed the address and charged meanwhile), and credits it at
	 * return on success, or puts it back on failure. A free that looked its record up at
	 * entry and deleted it at return raced with another thread handed the address in
	 * between: its delete, by key, could remove that thread's new record (the freed one then
	 * credited twice, the new one never).
	 */
	struct alloc_val rec;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64); /* pid_tgid */
	__type(value, struct call_args);
} call_args SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct alloc_key);
	__type(value, struct alloc_val);
} allocs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct fgpu_cg_key);
	__type(value, struct fgpu_cg_usage);
} cg_usage SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct fgpu_proc);
} procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct fgpu_cg_key);
	__type(value, __u64);
} tree_usage SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u64);
	__type(value, struct fgpu_cg_tree);
} cg_tree SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct fgpu_limit);
} limits SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u64);
	__type(value, struct fgpu_tenant);
} tenants SEC(".maps");

/* Room to build a cgroup's ancestry off the stack. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fgpu_cg_tree);
} scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FGPU_CTR_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22);
} events SEC(".maps");

static __always_inline void count(__u32 idx)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &idx);

	if (c)
		__sync_fetch_and_add(c, 1);
}

static __always_inline void emit(__u32 kind, __u32 api, __u32 tgid, __u32 tid, __u64 cgroup_id,
				 __u64 addr, __u64 size, __u32 device, __s32 result,
				 __u64 cgroup_bytes)
{
	struct fgpu_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e) {
		count(FGPU_CTR_RINGBUF_DROPS);
		return;
	}
	e->ts_ns = bpf_ktime_get_ns();
	e->cgroup_id = cgroup_id;
	e->addr = addr;
	e->size = size;
	e->tgid = tgid;
	e->tid = tid;
	e->kind = kind;
	e->api = api;
	e->device = device;
	e->result = result;
	e->cgroup_bytes = cgroup_bytes;
	bpf_ringbuf_submit(e, 0);
}

/*
 * Add `delta` (two's complement for a credit) to a (cgroup, device) total; returns the
 * total right after this change (so user space can tell which allocation crossed a limit).
 */
static __always_inline __u64 cg_add(__u64 cgroup_id, __u32 device, __u64 delta, int charge)
{
	struct fgpu_cg_key key = { .cgroup_id = cgroup_id, .device = device };
	struct fgpu_cg_usage *u = bpf_map_lookup_elem(&cg_usage, &key);

	if (!u) {
		struct fgpu_cg_usage zero = {};

		bpf_map_update_elem(&cg_usage, &key, &zero, BPF_NOEXIST);
		u = bpf_map_lookup_elem(&cg_usage, &key);
		if (!u) {
			count(FGPU_CTR_MAP_FULL);
			return 0;
		}
	}
	if (charge)
		__sync_fetch_and_add(&u->allocs, 1);
	else
		__sync_fetch_and_add(&u->frees, 1);
	return __sync_fetch_and_add(&u->bytes, delta) + delta;
}

/* Adds `delta` to a subtree total; returns the total right after this change. */
static __always_inline __u64 tree_add(__u64 cgroup_id, __u32 device, __u64 delta)
{
	struct fgpu_cg_key key = { .cgroup_id = cgroup_id, .device = device };
	__u64 *t = bpf_map_lookup_elem(&tree_usage, &key);

	if (!t) {
		__u64 zero = 0;

		bpf_map_update_elem(&tree_usage, &key, &zero, BPF_NOEXIST);
		t = bpf_map_lookup_elem(&tree_usage, &key);
		if (!t) {
			count(FGPU_CTR_MAP_FULL);
			return 0;
		}
	}
	return __sync_fetch_and_add(t, delta) + delta;
}

/* Credits `size` to every recorded ancestor of `cgroup_id` (frees and exit releases). */
static __always_inline void tree_credit(__u64 cgroup_id, __u32 device, __u64 size)
{
	struct fgpu_cg_tree *tree = bpf_map_lookup_elem(&cg_tree, &cgroup_id);

	if (!tree)
		return;
	for (int i = 0; i < FGPU_MAX_LEVELS; i++) {
		if (!tree->anc[i])
			break;
		tree_add(tree->anc[i], device, -size);
	}
}

static __always_inline struct fgpu_tenant *tenant_of(__u64 tenant)
{
	struct fgpu_tenant *t = bpf_map_lookup_elem(&tenants, &tenant);

	if (!t) {
		struct fgpu_tenant zero = {};

		bpf_map_update_elem(&tenants, &tenant, &zero, BPF_NOEXIST);
		t = bpf_map_lookup_elem(&tenants, &tenant);
	}
	return t;
}

static __always_inline void tenant_add(__u64 tenant, __s64 allocs, __s64 procs)
{
	struct fgpu_tenant *t = bpf_map_lookup_elem(&tenants, &tenant);

	if (!t)
		return;
	if (allocs)
		__sync_fetch_and_add(&t->allocs, allocs);
	if (procs)
		__sync_fetch_and_add(&t->procs, procs);
}

/* Adds `delta` to a process's bytes; the entry must exist (charge creates it). */
static __always_inline void proc_add(__u32 tgid, __u64 delta)
{
	struct fgpu_proc *p = bpf_map_lookup_elem(&procs, &tgid);

	if (p)
		__sync_fetch_and_add(&p->bytes, delta);
}

/* Credits a record taken out of `allocs` (a free, an exit). */
static __always_inline void credit_rec(__u32 tgid, __u32 tid, __u64 addr, __u32 api, __s32 rc,
				       const struct alloc_val *val)
{
	__u64 total = cg_add(val->cgroup_id, val->device, -val->size, 0);

	tree_credit(val->cgroup_id, val->device, val->size);
	tenant_add(val->tenant, -1, 0);
	proc_add(tgid, -val->size);
	emit(FGPU_EV_FREE, api, tgid, tid, val->cgroup_id, addr, val->size, val->device, rc, total);
}

/*
 * Forget (tgid, addr) and credit its owner (an allocation handed an address we still hold a
 * record of: we missed its free).
 */
static __always_inline void credit(__u32 tgid, __u32 tid, __u64 addr, __u32 api, __s32 rc)
{
	struct alloc_key key = { .tgid = tgid, .addr = addr };
	struct alloc_val *v = bpf_map_lookup_elem(&allocs, &key);
	struct alloc_val val;

	if (!v)
		return;
	val = *v;
	if (bpf_map_delete_elem(&allocs, &key) != 0)
		return; /* somebody else took it meanwhile */
	credit_rec(tgid, tid, addr, api, rc, &val);
}

/* Puts a record a free took out back (the free failed, or its thread died inside it). */
static __always_inline void restore(__u32 tgid, __u64 addr, const struct alloc_val *val)
{
	struct alloc_key key = { .tgid = tgid, .addr = addr };

	if (bpf_map_update_elem(&allocs, &key, val, BPF_NOEXIST) != 0)
		count(FGPU_CTR_MAP_FULL); /* still charged; released with the process */
}

/*
 * The ancestry of the current task's cgroup `cgroup_id`, recorded on first use. NULL if it
 * cannot be recorded (map full).
 */
static __always_inline struct fgpu_cg_tree *ancestry(__u64 cgroup_id)
{
	struct fgpu_cg_tree *tree = bpf_map_lookup_elem(&cg_tree, &cgroup_id);
	__u32 zero = 0;
	int level = 0;

	if (tree)
		return tree;
	tree = bpf_map_lookup_elem(&scratch, &zero);
	if (!tree)
		return NULL;
	/* The cgroup's own level: the deepest one with an ancestor id. */
	for (int l = 1; l < FGPU_MAX_DEPTH; l++) {
		if (!bpf_get_current_ancestor_cgroup_id(l))
			break;
		level = l;
	}
	for (int i = 0; i < FGPU_MAX_LEVELS; i++) {
		int l = level - i;

		tree->anc[i] = l >= 0 ? bpf_get_current_ancestor_cgroup_id(l) : 0;
	}
	tree->anc[0] = cgroup_id; /* the same id, read once */
	bpf_map_update_elem(&cg_tree, &cgroup_id, tree, BPF_NOEXIST);
	return bpf_map_lookup_elem(&cg_tree, &cgroup_id);
}

/* Applies a policy to the current process: SIGKILL or report only; returns FGPU_ACT_*. */
static __always_inline __s32 act(__u32 flags)
{
	long rc;

	if (!(flags & FGPU_LIMIT_KILL))
		return FGPU_ACT_REPORTED;
	rc = bpf_send_signal(9 /* SIGKILL */);
	if (rc != 0)
		return (__s32)rc;
	count(FGPU_CTR_KILLED);
	return FGPU_ACT_KILLED;
}

/* The node's policy for tenants without a limit of their own (key 0 of `limits`). */
static __always_inline __u32 default_flags(void)
{
	__u64 none = 0;
	struct fgpu_limit *l = bpf_map_lookup_elem(&limits, &none);

	return l ? l->flags : 0;
}

/* An allocation that cannot be tracked: counted, reported and dealt with by policy. */
static __always_inline void over_bound(__u32 tgid, __u32 tid, __u64 tenant, __u32 flags,
				       struct fgpu_tenant *t, __u64 addr, __u64 size,
				       __u32 device, __u32 api)
{
	count(FGPU_CTR_OVER_BOUND);
	if (t)
		__sync_fetch_and_add(&t->over_bound, 1);
	emit(FGPU_EV_OVER_BOUND, api, tgid, tid, tenant, addr, size, device, act(flags), 0);
}

static __always_inline void charge(__u32 tgid, __u32 tid, __u64 addr, __u64 size, __u32 device,
				   __u32 api, __s32 rc)
{
	__u64 cgroup_id = bpf_get_current_cgroup_id();
	struct alloc_key key = { .tgid = tgid, .addr = addr };
	struct alloc_val val = {
		.size = size,
		.cgroup_id = cgroup_id,
		.device = device,
	};
	struct fgpu_cg_tree *tree;
	struct fgpu_tenant *t;
	struct fgpu_proc *p;
	__u32 flags = default_flags(), crossed_flags = 0;
	__u64 tenant = cgroup_id, total, crossed = 0, crossed_total = 0;
	int new_proc = 0;

	/* A pointer handed out again while we still hold it means we missed its free. */
	credit(tgid, tid, addr, api, rc);
	/*
	 * A map that is full (or an element the kernel could not allocate) is no tenant's
	 * doing: such allocations are counted (FGPU_CTR_MAP_FULL), never killed for. Only a
	 * tenant's own bound applies its policy.
	 */
	tree = ancestry(cgroup_id);
	if (!tree) {
		count(FGPU_CTR_MAP_FULL);
		return;
	}
	/* The tenant: the topmost limited ancestor within reach, else the cgroup itself. */
	for (int i = 0; i < FGPU_MAX_LEVELS; i++) {
		__u64 id = tree->anc[i];
		struct fgpu_limit *l;

		if (!id)
			break;
		l = bpf_map_lookup_elem(&limits, &id);
		if (l) {
			tenant = id;
			flags = l->flags;
		}
	}
	t = tenant_of(tenant);
	if (!t) {
		count(FGPU_CTR_MAP_FULL);
		return;
	}
	p = bpf_map_lookup_elem(&procs, &tgid);
	if (t->allocs >= FGPU_TENANT_MAX_ALLOCS || (!p && t->procs >= FGPU_TENANT_MAX_PROCS)) {
		over_bound(tgid, tid, tenant, flags, t, addr, size, device, api);
		return;
	}
	if (!p) {
		struct fgpu_proc fresh = { .cgroup_id = cgroup_id, .tenant = tenant };

		if (bpf_map_update_elem(&procs, &tgid, &fresh, BPF_NOEXIST) == 0)
			new_proc = 1;
		p = bpf_map_lookup_elem(&procs, &tgid);
		if (!p) {
			count(FGPU_CTR_MAP_FULL);
			return;
		}
	}
	val.tenant = tenant;
	if (bpf_map_update_elem(&allocs, &key, &val, BPF_NOEXIST) != 0) {
		count(FGPU_CTR_MAP_FULL);
		return;
	}
	__sync_fetch_and_add(&t->allocs, 1);
	if (new_proc)
		__sync_fetch_and_add(&t->procs, 1);
	__sync_fetch_and_add(&p->bytes, size);
	total = cg_add(cgroup_id, device, size, 1);
	emit(FGPU_EV_ALLOC, api, tgid, tid, cgroup_id, addr, size, device, rc, total);

	/* Every ancestor's subtree total; the nearest limited one this takes past its limit. */
	for (int i = 0; i < FGPU_MAX_LEVELS; i++) {
		__u64 id = tree->anc[i], sum;
		struct fgpu_limit *l;

		if (!id)
			break;
		sum = tree_add(id, device, size);
		if (crossed)
			continue;
		l = bpf_map_lookup_elem(&limits, &id);
		if (l && sum > l->bytes) {
			crossed = id;
			crossed_total = sum;
			crossed_flags = l->flags;
		}
	}
	if (crossed) {
		count(FGPU_CTR_OVER_LIMIT);
		emit(FGPU_EV_OVER_LIMIT, api, tgid, tid, crossed, addr, size, device,
		     act(crossed_flags), crossed_total);
	}
}

SEC("uprobe")
int BPF_KPROBE(fgpu_enter, __u64 a0, __u64 a1, __u64 a2, __u64 a3)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct call_args args = {
		.api = bpf_get_attach_cookie(ctx),
		.a0 = a0,
		.a1 = a1,
		.a2 = a2,
		.a3 = a3,
	};

	switch (args.api) {
	case FGPU_API_CU_MEM_FREE:
	case FGPU_API_CU_MEM_FREE_ASYNC:
	case FGPU_API_CU_MEM_RELEASE:
	case FGPU_API_HIP_FREE:
	case FGPU_API_HIP_FREE_ASYNC:
	case FGPU_API_HIP_MEM_RELEASE: {
		struct alloc_key key = { .tgid = id >> 32, .addr = a0 };
		struct call_args *prev = bpf_map_lookup_elem(&call_args, &id);
		struct alloc_val *v;

		/* A second attachment (two agents during a restart): the first took the record. */
		if (prev && prev->api == args.api && prev->a0 == a0 && prev->freed == FREE_TAKEN)
			return 0;
		v = bpf_map_lookup_elem(&allocs, &key);
		args.freed = FREE_UNSEEN;
		if (v) {
			args.rec = *v;
			if (bpf_map_delete_elem(&allocs, &key) == 0)
				args.freed = FREE_TAKEN;
		}
		break;
	}
	default:
		break;
	}
	bpf_map_update_elem(&call_args, &id, &args, BPF_ANY);
	return 0;
}

SEC("uretprobe")
int BPF_KRETPROBE(fgpu_leave, long ret)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	__s32 rc = (__s32)ret;
	struct call_args *stored = bpf_map_lookup_elem(&call_args, &id);
	struct call_args a;
	__u64 out = 0, size = 0, pitch = 0;
	__u32 device = FGPU_DEVICE_CURRENT;

	if (!stored)
		return 0;
	a = *stored;
	bpf_map_delete_elem(&call_args, &id);
	if (rc != 0) {
		count(FGPU_CTR_FAILED_CALLS);
		if (a.freed == FREE_TAKEN)
			restore(tgid, a.a0, &a.rec); /* the memory is still held */
		return 0;
	}

	switch (a.api) {
	case FGPU_API_CU_MEM_FREE:
	case FGPU_API_CU_MEM_FREE_ASYNC:
	case FGPU_API_CU_MEM_RELEASE:
	case FGPU_API_HIP_FREE:
	case FGPU_API_HIP_FREE_ASYNC:
	case FGPU_API_HIP_MEM_RELEASE:
		if (a.freed == FREE_TAKEN)
			credit_rec(tgid, tid, a.a0, a.api, rc, &a.rec);
		else if (a.a0)
			count(FGPU_CTR_UNKNOWN_FREES);
		return 0;
	case FGPU_API_CU_MEM_ALLOC:
	case FGPU_API_CU_MEM_ALLOC_MANAGED:
	case FGPU_API_CU_MEM_ALLOC_ASYNC:
	case FGPU_API_CU_MEM_ALLOC_POOL:
	case FGPU_API_HIP_MALLOC:
	case FGPU_API_HIP_EXT_MALLOC_WITH_FLAGS:
	case FGPU_API_HIP_MALLOC_MANAGED:
	case FGPU_API_HIP_MALLOC_ASYNC:
	case FGPU_API_HIP_MALLOC_FROM_POOL_ASYNC:
		size = a.a1;
		break;
	case FGPU_API_CU_MEM_ALLOC_PITCH:
		/* pitch × height: the driver pads each row. */
		if (bpf_probe_read_user(&pitch, sizeof(pitch), (void *)a.a1) != 0)
			return 0;
		size = pitch * a.a3;
		break;
	case FGPU_API_CU_MEM_CREATE:
	case FGPU_API_HIP_MEM_CREATE: {
		__u32 loc[2] = {};

		if (bpf_probe_read_user(loc, sizeof(loc),
					(void *)(a.a2 + CU_MEM_PROP_LOCATION_TYPE_OFF)) != 0)
			return 0;
		if (loc[0] != CU_MEM_LOCATION_TYPE_DEVICE)
			return 0; /* host or host-NUMA memory is not GPU memory */
		device = loc[1];
		size = a.a1;
		break;
	}
	default:
		return 0;
	}
	/* Every allocation entry point returns its pointer or handle through a0. */
	if (bpf_probe_read_user(&out, sizeof(out), (void *)a.a0) != 0)
		return 0;
	charge(tgid, tid, out, size, device, a.api, rc);
	return 0;
}

struct release_ctx {
	__u32 tgid;
	__u64 released;
};

static long release_one(void *map, struct alloc_key *key, struct alloc_val *val,
			struct release_ctx *rctx)
{
	if (key->tgid != rctx->tgid)
		return 0;
	cg_add(val->cgroup_id, val->device, -val->size, 0);
	tree_credit(val->cgroup_id, val->device, val->size);
	tenant_add(val->tenant, -1, 0);
	rctx->released += val->size;
	bpf_map_delete_elem(map, key);
	return 0;
}

SEC("tracepoint/sched/sched_process_exit")
int fgpu_sched_exit(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	struct release_ctx rctx = { .tgid = tgid };
	struct call_args *left;
	struct fgpu_proc *p;
	__u64 cgroup_id, tenant;

	/*
	 * A thread that died inside a probed call leaves its arguments behind; inside a free,
	 * with its record taken out. Whether the driver released that memory is unknown: it
	 * stays charged while the process lives (released with it), and is credited if the
	 * process was released already.
	 */
	left = bpf_map_lookup_elem(&call_args, &id);
	if (left && left->freed == FREE_TAKEN) {
		if (bpf_map_lookup_elem(&procs, &tgid))
			restore(tgid, left->a0, &left->rec);
		else
			credit_rec(tgid, (__u32)id, left->a0, (__u32)left->api, 0, &left->rec);
	}
	bpf_map_delete_elem(&call_args, &id);
	if ((__u32)id != tgid)
		return 0; /* not the thread-group leader */
	p = bpf_map_lookup_elem(&procs, &tgid);
	if (!p)
		return 0; /* held no GPU memory: the common case, kept cheap */
	cgroup_id = p->cgroup_id;
	tenant = p->tenant;
	bpf_for_each_map_elem(&allocs, release_one, &rctx, 0);
	if (bpf_map_delete_elem(&procs, &tgid) == 0)
		tenant_add(tenant, 0, -1);
	emit(FGPU_EV_EXIT, 0, tgid, (__u32)id, cgroup_id, 0, rctx.released, FGPU_DEVICE_CURRENT, 0,
	     0);
	return 0;
}

SEC("tracepoint/sched/sched_process_exec")
int fgpu_sched_exec(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();

	emit(FGPU_EV_EXEC, 0, id >> 32, (__u32)id, bpf_get_current_cgroup_id(), 0, 0,
	     FGPU_DEVICE_CURRENT, 0, 0);
	return 0;
}
