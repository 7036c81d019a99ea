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
 * State kept here (user space reads it; the agent writes `limits` and the shared parents):
 *   call_args  task-local: the arguments of the probed call a thread is inside
 *   allocs     (tgid, pointer or VMM handle) -> (size, cgroup, device, tenant)
 *   cg_usage   (cgroup, device) -> bytes held by the cgroup's own processes, allocs, frees
 *   tree_usage (cgroup, device) -> bytes held by the cgroup and all its descendants
 *   cg_tree    cgroup -> its ancestry (struct fgpu_cg_tree), bounded per tenant
 *   limits     cgroup -> threshold and policy (struct fgpu_limit), written by the agent
 *   shared     cgroup -> 1 for the node's shared parents, written by the agent
 *   shared_paths  a shared parent's path -> its id, written by the agent (cgroup_mkdir)
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
 *
 * What a tenant controls is untrusted: a tenant can fill no map others depend on (call
 * arguments are task-local; cgroups, processes and allocations are bounded per tenant, and
 * a tenant is a cgroup it cannot make more of (struct fgpu_tenant); a removed cgroup is
 * pruned from every cgroup-keyed map), and what it can rewrite in its own memory
 * between the driver's write and the return probe's read (the output pointer, the pitch,
 * the allocation properties) can only make it charged more, never less.
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
	__u64 api; /* FGPU_API_*; 0 once the return consumed the call */
	__u64 a0, a1, a2, a3;
	__u64 freed;
	/*
	 * cuMemCreate's prop->location as read at entry (before the driver reads it); the
	 * return reads it again and charges device memory if either read says device.
	 */
	__u32 loc_type, loc_id;
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

/*
 * Task-local: each thread's slot lives and dies with the thread, so no number of threads
 * parked inside probed calls can take another thread's slot (a node-wide map keyed by thread
 * could be filled by one tenant, after which nobody's calls were charged).
 */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct call_args);
} call_args SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FGPU_TENANT_MAX_ALLOCS * FGPU_TENANTS_AT_BOUND);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct alloc_key);
	__type(value, struct alloc_val);
} allocs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	/* A tracked cgroup has an entry per device it allocated on. */
	__uint(max_entries, FGPU_TENANT_MAX_CGROUPS * FGPU_MAX_DEVICES * FGPU_TENANTS_AT_BOUND);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct fgpu_cg_key);
	__type(value, struct fgpu_cg_usage);
} cg_usage SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FGPU_TENANT_MAX_PROCS * FGPU_TENANTS_AT_BOUND);
	__type(key, __u32);
	__type(value, struct fgpu_proc);
} procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	/* The tenants' cgroups, their structural tenants and the shared parents, per device. */
	__uint(max_entries,
	       ((FGPU_TENANT_MAX_CGROUPS + 1) * FGPU_TENANTS_AT_BOUND + FGPU_MAX_SHARED) *
		       FGPU_MAX_DEVICES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct fgpu_cg_key);
	__type(value, __u64);
} tree_usage SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FGPU_TENANT_MAX_CGROUPS * FGPU_TENANTS_AT_BOUND);
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

/* The node's shared parents (cgroup id -> 1): written by the agent, pruned at rmdir. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FGPU_MAX_SHARED);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u64);
	__type(value, __u32);
} shared SEC(".maps");

/* The same cgroups by path, for cgroup_mkdir (whose record names the new cgroup's path). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FGPU_MAX_SHARED);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct fgpu_shared_path);
	__type(value, __u64);
} shared_paths SEC(".maps");

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

/* Room to build a path key off the stack. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fgpu_shared_path);
} path_scratch SEC(".maps");

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

/*
 * Forgets every record of cgroup `cgroup_id` if its processes hold nothing on any device:
 * its totals, its subtree totals, its ancestry (and the tenant count of it), and its own
 * tenant entry when that tracks nothing. Returns 1 if it pruned, 0 if bytes are held.
 * Called when the cgroup is removed, and after each credit to a removed cgroup (whichever
 * of the two sees the last byte go prunes: both mark before they look).
 */
static __always_inline int prune(__u64 cgroup_id)
{
	struct fgpu_cg_tree *tree;
	struct fgpu_tenant *t;
	__u64 counted, weight;

	for (__u32 d = 0; d < FGPU_MAX_DEVICES; d++) {
		struct fgpu_cg_key key = { .cgroup_id = cgroup_id, .device = d };
		struct fgpu_cg_usage *u = bpf_map_lookup_elem(&cg_usage, &key);

		if (u && u->bytes)
			return 0;
	}
	for (__u32 d = 0; d < FGPU_MAX_DEVICES; d++) {
		struct fgpu_cg_key key = { .cgroup_id = cgroup_id, .device = d };

		bpf_map_delete_elem(&cg_usage, &key);
		bpf_map_delete_elem(&tree_usage, &key);
	}
	tree = bpf_map_lookup_elem(&cg_tree, &cgroup_id);
	if (tree) {
		counted = tree->counted;
		weight = tree->weight;
		/* Only the one that deletes it gives its place back. */
		if (bpf_map_delete_elem(&cg_tree, &cgroup_id) == 0) {
			t = bpf_map_lookup_elem(&tenants, &counted);
			if (t)
				__sync_fetch_and_add(&t->cgroups, -weight);
			count(FGPU_CTR_CGROUPS_PRUNED);
		}
	}
	t = bpf_map_lookup_elem(&tenants, &cgroup_id);
	if (cgroup_id && t && t->allocs <= 0 && t->procs <= 0 && t->cgroups <= 0)
		bpf_map_delete_elem(&tenants, &cgroup_id);
	return 1;
}

/* After a credit to `cgroup_id`: prunes it if it was removed and holds nothing now. */
static __always_inline void prune_if_gone(__u64 cgroup_id)
{
	struct fgpu_cg_tree *tree = bpf_map_lookup_elem(&cg_tree, &cgroup_id);

	if (tree && tree->gone)
		prune(cgroup_id);
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
	prune_if_gone(val->cgroup_id);
}

/* Puts a record a free took out back (the free failed, or its thread died inside it). */
static __always_inline void restore(__u32 tgid, __u64 addr, const struct alloc_val *val)
{
	struct alloc_key key = { .tgid = tgid, .addr = addr };

	if (bpf_map_update_elem(&allocs, &key, val, BPF_NOEXIST) != 0)
		count(FGPU_CTR_MAP_FULL); /* still charged; released with the process */
}

/* The node's policy for tenants without a limit of their own (key 0 of `limits`). */
static __always_inline __u32 default_flags(void)
{
	__u64 none = 0;
	struct fgpu_limit *l = bpf_map_lookup_elem(&limits, &none);

	return l ? l->flags : 0;
}

/*
 * The tenant of a cgroup whose ancestry is `tree` (see struct fgpu_tenant): the topmost
 * limited cgroup within reach at or below its structural tenant, else that one. `*flags`:
 * the tenant's policy (its limit's, else the node's default).
 */
static __always_inline __u64 tenant_in(const struct fgpu_cg_tree *tree, __u32 *flags)
{
	__u64 tenant = tree->structural;

	*flags = default_flags();
	for (int i = 0; i < FGPU_MAX_LEVELS; i++) {
		__u64 id = tree->anc[i];
		struct fgpu_limit *l;

		if (!id || i > tree->below)
			break; /* past the root, or a shared parent above the structural tenant */
		l = bpf_map_lookup_elem(&limits, &id);
		if (l) {
			tenant = id;
			*flags = l->flags;
		}
	}
	return tenant;
}

/*
 * The ancestry of the current task's cgroup `cgroup_id`, recorded on first use and counted
 * against its tenant. NULL if it cannot be recorded: `*bound` is then the tenant whose bound
 * on cgroups was reached, or ~0 if a map was full.
 */
static __always_inline struct fgpu_cg_tree *ancestry(__u64 cgroup_id, __u64 *bound)
{
	struct fgpu_cg_tree *tree = bpf_map_lookup_elem(&cg_tree, &cgroup_id);
	struct fgpu_tenant *t;
	__u64 key;
	__u32 zero = 0, flags;
	int level = 0, slevel = -1;

	*bound = ~0ULL;
	if (tree)
		return tree;
	tree = bpf_map_lookup_elem(&scratch, &zero);
	if (!tree)
		return NULL;
	/*
	 * The cgroup's own level (the deepest one with an ancestor id), and its structural
	 * tenant's: walking down from the root, the first cgroup not marked shared. Walked from
	 * the root, not within anc[], so that nesting deeper than anc[] reaches finds no tenant
	 * of its own.
	 */
	for (int l = 1; l < FGPU_MAX_DEPTH; l++) {
		__u64 id = bpf_get_current_ancestor_cgroup_id(l);

		if (!id)
			break;
		level = l;
		if (slevel < 0 && !bpf_map_lookup_elem(&shared, &id))
			slevel = l;
	}
	if (slevel < 0)
		slevel = level; /* every cgroup on the way is shared: the cgroup itself */
	for (int i = 0; i < FGPU_MAX_LEVELS; i++) {
		int l = level - i;

		tree->anc[i] = l >= 0 ? bpf_get_current_ancestor_cgroup_id(l) : 0;
	}
	tree->anc[0] = cgroup_id; /* the same id, read once */
	tree->structural = slevel == level ? cgroup_id : bpf_get_current_ancestor_cgroup_id(slevel);
	tree->below = level - slevel < FGPU_MAX_LEVELS ? level - slevel : FGPU_MAX_LEVELS;
	/* Itself and the cgroups between it and its structural tenant (see fgpu.h). */
	tree->weight = tree->below > 1 ? tree->below : 1;
	key = tenant_in(tree, &flags);
	t = tenant_of(key);
	if (!t)
		return NULL;
	if (t->cgroups + tree->weight > FGPU_TENANT_MAX_CGROUPS) {
		*bound = key;
		return NULL;
	}
	tree->counted = key;
	tree->gone = 0;
	if (bpf_map_update_elem(&cg_tree, &cgroup_id, tree, BPF_NOEXIST) == 0)
		__sync_fetch_and_add(&t->cgroups, tree->weight);
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

/* The policy of tenant `key` (a limited cgroup; else the node's default). */
static __always_inline __u32 flags_of(__u64 key)
{
	struct fgpu_limit *l = key ? bpf_map_lookup_elem(&limits, &key) : NULL;

	return l ? l->flags : default_flags();
}

/* A sequence number for FGPU_ADDR_SYNTH keys (also counts them). */
static __always_inline __u64 synth_addr(void)
{
	__u32 idx = FGPU_CTR_ADDR_UNTRUSTED;
	__u64 *c = bpf_map_lookup_elem(&counters, &idx);

	return FGPU_ADDR_SYNTH | (c ? __sync_fetch_and_add(c, 1) : bpf_ktime_get_ns());
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

/*
 * Charges a successful allocation of `size` bytes. `addr` is what the output slot held when
 * the return probe read it (`addr_ok`: read at all); another thread of the process could
 * have rewritten it since the driver's write, so it is only believed if no record of this
 * process holds it already. An address that is still held (a free we never saw, or a slot
 * rewritten to an old pointer to hide the new one) keeps its record, and the new bytes are
 * charged under a key of their own, released with the process: never less charged.
 */
static __always_inline void charge(__u32 tgid, __u32 tid, __u64 addr, int addr_ok, __u64 size,
				   __u32 device, __u32 api, __s32 rc)
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
	__u32 flags, crossed_flags = 0;
	__u64 tenant, total, crossed = 0, crossed_total = 0, bound;
	int new_proc = 0;

	if (!addr_ok || !addr || (addr & FGPU_ADDR_SYNTH) || bpf_map_lookup_elem(&allocs, &key))
		key.addr = synth_addr();
	/*
	 * A map that is full (or an element the kernel could not allocate) is no tenant's
	 * doing: such allocations are counted (FGPU_CTR_MAP_FULL), never killed for. Only a
	 * tenant's own bound applies its policy.
	 */
	tree = ancestry(cgroup_id, &bound);
	if (!tree) {
		if (bound == ~0ULL) {
			count(FGPU_CTR_MAP_FULL);
			return;
		}
		t = tenant_of(bound);
		over_bound(tgid, tid, bound, flags_of(bound), t, key.addr, size, device, api);
		return;
	}
	/* Found again for each allocation: a limit set since applies. */
	tenant = tenant_in(tree, &flags);
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
		/* Inserted meanwhile by another thread of the process: a key of its own. */
		key.addr = synth_addr();
		if (bpf_map_update_elem(&allocs, &key, &val, BPF_NOEXIST) != 0) {
			count(FGPU_CTR_MAP_FULL);
			return;
		}
	}
	__sync_fetch_and_add(&t->allocs, 1);
	if (new_proc)
		__sync_fetch_and_add(&t->procs, 1);
	__sync_fetch_and_add(&p->bytes, size);
	total = cg_add(cgroup_id, device, size, 1);
	emit(FGPU_EV_ALLOC, api, tgid, tid, cgroup_id, key.addr, size, device, rc, total);

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
		emit(FGPU_EV_OVER_LIMIT, api, tgid, tid, crossed, key.addr, size, device,
		     act(crossed_flags), crossed_total);
	}
}

/* The calling thread's call slot, created on first use; NULL if it cannot be had. */
static __always_inline struct call_args *slot(int create)
{
	return bpf_task_storage_get(&call_args, bpf_get_current_task_btf(), 0,
				    create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
}

static __always_inline int is_free(__u64 api)
{
	switch (api) {
	case FGPU_API_CU_MEM_FREE:
	case FGPU_API_CU_MEM_FREE_ASYNC:
	case FGPU_API_CU_MEM_RELEASE:
	case FGPU_API_HIP_FREE:
	case FGPU_API_HIP_FREE_ASYNC:
	case FGPU_API_HIP_MEM_RELEASE:
		return 1;
	default:
		return 0;
	}
}

/*
 * The policy of the current task's tenant, found without recording anything (for a call
 * whose arguments could not be stored): that of the topmost limited cgroup at or below its
 * structural tenant, else the node's.
 */
static __always_inline __u32 caller_flags(void)
{
	int reached = 0;

	for (int l = 1; l < FGPU_MAX_DEPTH; l++) {
		__u64 id = bpf_get_current_ancestor_cgroup_id(l);
		struct fgpu_limit *lim;

		if (!id)
			break;
		if (!reached && bpf_map_lookup_elem(&shared, &id))
			continue;
		reached = 1;
		lim = bpf_map_lookup_elem(&limits, &id);
		if (lim)
			return lim->flags;
	}
	return default_flags();
}

SEC("uprobe")
int BPF_KPROBE(fgpu_enter, __u64 a0, __u64 a1, __u64 a2, __u64 a3)
{
	__u64 id = bpf_get_current_pid_tgid(), api = bpf_get_attach_cookie(ctx);
	struct call_args *args = slot(1);

	if (!args) {
		/*
		 * No slot (the kernel could not allocate one): the call cannot be charged. A free
		 * keeps its record (still charged, released with the process); an allocation fails
		 * closed for this caller alone, by its tenant's policy.
		 */
		count(FGPU_CTR_ARGS_LOST);
		if (!is_free(api)) {
			__s32 acted = act(caller_flags());

			emit(FGPU_EV_OVER_BOUND, (__u32)api, id >> 32, (__u32)id,
			     bpf_get_current_cgroup_id(), 0, a1, FGPU_DEVICE_CURRENT, acted, 0);
		}
		return 0;
	}
	if (is_free(api)) {
		struct alloc_key key = { .tgid = id >> 32, .addr = a0 };
		struct alloc_val *v;

		/* A second attachment (two agents during a restart): the first took the record. */
		if (args->api == api && args->a0 == a0 && args->freed == FREE_TAKEN)
			return 0;
		args->api = api;
		args->a0 = a0;
		args->freed = FREE_UNSEEN;
		v = bpf_map_lookup_elem(&allocs, &key);
		if (v) {
			/* Stored in the slot first, then taken out: never held by nobody. */
			args->rec = *v;
			if (bpf_map_delete_elem(&allocs, &key) == 0)
				args->freed = FREE_TAKEN;
		}
		return 0;
	}
	args->api = api;
	args->a0 = a0;
	args->a1 = a1;
	args->a2 = a2;
	args->a3 = a3;
	args->freed = 0;
	args->loc_type = 0;
	args->loc_id = 0;
	if (api == FGPU_API_CU_MEM_CREATE || api == FGPU_API_HIP_MEM_CREATE) {
		__u32 loc[2] = {};

		if (bpf_probe_read_user(loc, sizeof(loc),
					(void *)(a2 + CU_MEM_PROP_LOCATION_TYPE_OFF)) == 0) {
			args->loc_type = loc[0];
			args->loc_id = loc[1];
		}
	}
	return 0;
}

/*
 * cuMemAllocPitch's bytes: height rows of the pitch the driver wrote back, but never less
 * than the width rounded up to FGPU_PITCH_ALIGN (a pitch rewritten by another thread, or
 * unreadable, cannot shrink the charge) and not more than FGPU_PITCH_SLACK above that (a
 * pitch rewritten huge cannot wrap the product).
 */
static __always_inline __u64 pitch_bytes(__u64 p_pitch, __u64 width, __u64 height)
{
	__u64 floor = (width + FGPU_PITCH_ALIGN - 1) & ~((__u64)FGPU_PITCH_ALIGN - 1);
	__u64 pitch = 0;

	if (bpf_probe_read_user(&pitch, sizeof(pitch), (void *)p_pitch) != 0 || pitch < floor ||
	    pitch > floor + FGPU_PITCH_SLACK)
		pitch = floor;
	return pitch * height;
}

SEC("uretprobe")
int BPF_KRETPROBE(fgpu_leave, long ret)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	__s32 rc = (__s32)ret;
	struct call_args *stored = slot(0);
	struct call_args a;
	__u64 out = 0, size = 0;
	__u32 device = FGPU_DEVICE_CURRENT;
	int addr_ok;

	if (!stored || !stored->api)
		return 0;
	a = *stored;
	stored->api = 0; /* consumed: a second attachment's return finds nothing */
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
		size = pitch_bytes(a.a1, a.a2, a.a3);
		break;
	case FGPU_API_CU_MEM_CREATE:
	case FGPU_API_HIP_MEM_CREATE: {
		__u32 loc[2] = {};

		/* Device memory if the properties said so before the driver read them or after. */
		if (a.loc_type != CU_MEM_LOCATION_TYPE_DEVICE) {
			if (bpf_probe_read_user(loc, sizeof(loc),
						(void *)(a.a2 + CU_MEM_PROP_LOCATION_TYPE_OFF)) != 0 ||
			    loc[0] != CU_MEM_LOCATION_TYPE_DEVICE)
				return 0; /* host or host-NUMA memory is not GPU memory */
			a.loc_id = loc[1];
		}
		device = a.loc_id < FGPU_MAX_DEVICES ? a.loc_id : FGPU_DEVICE_CURRENT;
		size = a.a1;
		break;
	}
	default:
		return 0;
	}
	/*
	 * Every allocation entry point returns its pointer or handle through a0. What is read
	 * there only names the record (charge() checks it); the bytes are charged regardless.
	 */
	addr_ok = bpf_probe_read_user(&out, sizeof(out), (void *)a.a0) == 0;
	charge(tgid, tid, out, addr_ok, size, device, a.api, rc);
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
	prune_if_gone(val->cgroup_id);
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
	left = slot(0);
	if (left && left->api && left->freed == FREE_TAKEN) {
		if (bpf_map_lookup_elem(&procs, &tgid))
			restore(tgid, left->a0, &left->rec);
		else
			credit_rec(tgid, (__u32)id, left->a0, (__u32)left->api, 0, &left->rec);
	}
	if (left)
		left->api = 0; /* the slot itself goes with the task */
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

/*
 * tracepoints cgroup/cgroup_mkdir and cgroup/cgroup_rmdir (include/trace/events/cgroup.h,
 * class `cgroup`).
 */
struct cgroup_dir_args {
	__u64 common;
	int root;  /* hierarchy id: 0 is the v2 (default) hierarchy */
	int level;
	__u64 id;  /* cgroup id: the inode of its directory */
	__u32 path_loc; /* __data_loc: offset from the record's start (low 16 bits), length */
};

/*
 * The path of the cgroup a cgroup_mkdir/rmdir record names, zero-padded in the per-CPU
 * scratch key, cut at its last '/' when `parent` (the parent's path; "" for the root's
 * children). NULL if it does not fit a key (such a cgroup is never marked shared).
 */
static __always_inline struct fgpu_shared_path *record_path(struct cgroup_dir_args *ctx,
							    int parent)
{
	__u32 zero = 0, off = ctx->path_loc & 0xffff, len = ctx->path_loc >> 16;
	struct fgpu_shared_path *p = bpf_map_lookup_elem(&path_scratch, &zero);
	long n;
	int cut = 0;

	if (!p || len > FGPU_SHARED_PATH_MAX)
		return NULL;
	__builtin_memset(p->path, 0, sizeof(p->path));
	n = bpf_probe_read_kernel_str(p->path, sizeof(p->path), (char *)ctx + off);
	if (n <= 0 || n >= FGPU_SHARED_PATH_MAX)
		return NULL;
	if (!parent)
		return p;
	/* The last '/' (n counts the NUL), then the path read again up to it. */
	for (int i = 0; i < FGPU_SHARED_PATH_MAX; i++) {
		long j = n - 2 - i;

		if (j < 0)
			break;
		if (p->path[j & (FGPU_SHARED_PATH_MAX - 1)] == '/') {
			cut = j;
			break;
		}
	}
	__builtin_memset(p->path, 0, sizeof(p->path));
	if (cut > 0 &&
	    bpf_probe_read_kernel_str(p->path, (cut & (FGPU_SHARED_PATH_MAX - 1)) + 1,
				      (char *)ctx + off) <= 0)
		return NULL;
	return p;
}

/*
 * A cgroup was made: tell the agent if it lies directly under the root or under a shared
 * parent (FGPU_EV_CGROUP_NEW), where only the node makes cgroups; the agent marks it if it
 * is a shared parent too. A tenant's own cgroups are below its structural tenant, which is
 * never marked, so no tenant can make these records.
 */
SEC("tracepoint/cgroup/cgroup_mkdir")
int fgpu_cgroup_mkdir(struct cgroup_dir_args *ctx)
{
	struct fgpu_shared_path *parent;

	if (ctx->root != 0)
		return 0; /* a v1 hierarchy */
	if (ctx->level > 1) {
		parent = record_path(ctx, 1);
		if (!parent || !bpf_map_lookup_elem(&shared_paths, parent))
			return 0;
	}
	emit(FGPU_EV_CGROUP_NEW, 0, 0, 0, ctx->id, 0, 0, FGPU_DEVICE_CURRENT, ctx->level, 0);
	return 0;
}

/*
 * A cgroup was removed: forget it if it was a shared parent; prune its records now if its processes hold nothing (the usual case:
 * a cgroup with live processes cannot be removed, and their exits released their bytes),
 * else mark it so that the credit of its last byte prunes it (a process that moved out
 * holding memory). Either way user space is told (FGPU_EV_CGROUP_GONE).
 */
SEC("tracepoint/cgroup/cgroup_rmdir")
int fgpu_cgroup_rmdir(struct cgroup_dir_args *ctx)
{
	__u64 id = ctx->id, held = 0;
	struct fgpu_cg_tree *tree;

	if (ctx->root != 0)
		return 0; /* a v1 hierarchy: not what the probes charge */
	if (bpf_map_delete_elem(&shared, &id) == 0) {
		struct fgpu_shared_path *path = record_path(ctx, 0);

		if (path)
			bpf_map_delete_elem(&shared_paths, path);
	}
	tree = bpf_map_lookup_elem(&cg_tree, &id);
	if (tree)
		__sync_fetch_and_add(&tree->gone, 1); /* marked before looking: see prune() */
	if (!prune(id)) {
		for (__u32 d = 0; d < FGPU_MAX_DEVICES; d++) {
			struct fgpu_cg_key key = { .cgroup_id = id, .device = d };
			struct fgpu_cg_usage *u = bpf_map_lookup_elem(&cg_usage, &key);

			if (u)
				held += u->bytes;
		}
	}
	emit(FGPU_EV_CGROUP_GONE, 0, 0, 0, id, 0, held, FGPU_DEVICE_CURRENT, 0, 0);
	return 0;
}
