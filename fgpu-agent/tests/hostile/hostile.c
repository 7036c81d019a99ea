/*
 * A hostile tenant for the kernel side's trust tests (e2e_trust_kernel.rs): it talks to the
 * driver library directly (no shim), as a bypasser would, and attacks what the probes read
 * or store. Built by the test with the system C compiler; the driver is whatever
 * `libcuda.so.1` the loader finds (the simulator in CI).
 *
 *   hostile park THREADS CHUNK COUNT
 *       THREADS threads call cuMemFree_v2 on addresses nobody holds and stay inside it (the
 *       simulator's FGPU_SIM_FREE_DELAY_MS stands in for a free that waits on work); prints
 *       "parked THREADS", waits for a line on stdin, then allocates CHUNK bytes COUNT times.
 *   hostile block-free THREADS MS CHUNK COUNT
 *       allocates THREADS x 1 MiB, launches a kernel that spins MS ms, has THREADS threads
 *       free one each (a real cuMemFree waits for the device), and meanwhile allocates CHUNK
 *       COUNT times, printing when each returned; then how long each free took.
 *   hostile race-ptr CHUNK COUNT
 *       allocates once, then COUNT times more while a second thread rewrites the output slot
 *       back to the first allocation's address as soon as the driver writes a new one.
 *   hostile race-pitch WIDTH HEIGHT COUNT
 *       cuMemAllocPitch_v2 COUNT times while a second thread rewrites the returned pitch to 0.
 *   hostile churn DIR N CHUNK [keep|hold-every K]
 *       N times: create DIR/c<i>, move itself there, remove the last one, allocate CHUNK and
 *       free it. With `keep` no cgroup is removed; with `hold-every K` every K-th allocation
 *       is held across the move and freed after its cgroup was removed. Prints "cgroup i ok"
 *       after each allocation, "churned N" at the end (back in DIR).
 *   hostile spread DIR K PER CHUNK
 *       K times: create DIR/s<i>, move itself there and allocate CHUNK bytes PER times,
 *       holding everything; prints "held K*PER", waits for a line on stdin, then does the
 *       same in one more cgroup, DIR/s<K>, and prints "done".
 *
 * Every allocation prints "alloc i ok" (or "alloc i rc=N"); "done" at the end.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int (*init_fn)(unsigned);
typedef int (*dev_get_fn)(int *, int);
typedef int (*retain_fn)(void **, int);
typedef int (*set_current_fn)(void *);
typedef int (*alloc_fn)(uint64_t *, size_t);
typedef int (*pitch_fn)(uint64_t *, size_t *, size_t, size_t, unsigned);
typedef int (*free_fn)(uint64_t);
typedef int (*module_load_fn)(void **, const void *);
typedef int (*get_function_fn)(void **, void *, const char *);
typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
			 unsigned, void *, void **, void **);

static alloc_fn mem_alloc;
static pitch_fn mem_alloc_pitch;
static free_fn mem_free;
static set_current_fn set_current_ctx;
static void *ctx, *lib_handle;

static void *sym(void *lib, const char *name)
{
	void *p = dlsym(lib, name);

	if (!p) {
		printf("error missing=%s\n", name);
		exit(2);
	}
	return p;
}

static void open_driver(void)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW);
	set_current_fn set_current;
	retain_fn retain;
	dev_get_fn dev_get;
	init_fn init;
	int dev = 0;

	if (!lib) {
		printf("error dlopen=%s\n", dlerror());
		exit(2);
	}
	init = (init_fn)sym(lib, "cuInit");
	dev_get = (dev_get_fn)sym(lib, "cuDeviceGet");
	retain = (retain_fn)sym(lib, "cuDevicePrimaryCtxRetain");
	set_current = (set_current_fn)sym(lib, "cuCtxSetCurrent");
	set_current_ctx = set_current;
	lib_handle = lib;
	mem_alloc = (alloc_fn)sym(lib, "cuMemAlloc_v2");
	mem_alloc_pitch = (pitch_fn)sym(lib, "cuMemAllocPitch_v2");
	mem_free = (free_fn)sym(lib, "cuMemFree_v2");
	if (init(0) || dev_get(&dev, 0) || retain(&ctx, dev) || set_current(ctx)) {
		printf("error init\n");
		exit(2);
	}
}

__attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

/* ---- park ---- */

static volatile long started;

static void *parked_free(void *arg)
{
	__sync_fetch_and_add(&started, 1);
	mem_free((uint64_t)(uintptr_t)arg); /* an address nobody holds; the driver waits */
	return NULL;
}

static void allocate(long count, size_t chunk)
{
	for (long i = 0; i < count; i++) {
		uint64_t p = 0;
		int rc = mem_alloc(&p, chunk);

		if (rc)
			say("alloc %ld rc=%d", i, rc);
		else
			say("alloc %ld ok", i);
	}
}

static int park(long threads, size_t chunk, long count)
{
	pthread_attr_t attr;
	char line[16];

	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 64 << 10);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	for (long i = 0; i < threads; i++) {
		pthread_t t;
		void *addr = (void *)(uintptr_t)(0x7e0000000000ULL + (uint64_t)i * 4096);

		if (pthread_create(&t, &attr, parked_free, addr) != 0) {
			say("error pthread_create at %ld errno=%d", i, errno);
			return 1;
		}
	}
	while (started < threads)
		usleep(1000);
	usleep(300 * 1000); /* inside the free by now (it waits seconds) */
	say("parked %ld", threads);
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	allocate(count, chunk);
	say("done");
	return 0;
}

/* ---- frees blocked behind a long kernel (the real driver) ---- */

/* A kernel that spins for `ns` nanoseconds of the GPU's global timer. */
static const char SPIN_PTX[] =
	".version 7.0\n.target sm_70\n.address_size 64\n"
	".visible .entry spin(.param .u64 ns)\n{\n"
	"  .reg .u64 %t0, %t1, %d, %n;\n  .reg .pred %p;\n"
	"  ld.param.u64 %n, [ns];\n  mov.u64 %t0, %globaltimer;\n"
	"L: mov.u64 %t1, %globaltimer;\n  sub.u64 %d, %t1, %t0;\n"
	"  setp.lt.u64 %p, %d, %n;\n  @%p bra L;\n  ret;\n}\n";

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

struct timed_free {
	uint64_t ptr, t0, took;
	int rc;
};

static void *blocked_free(void *arg)
{
	struct timed_free *f = arg;

	set_current_ctx(ctx);
	f->t0 = now_ns();
	f->rc = mem_free(f->ptr);
	f->took = now_ns() - f->t0;
	return NULL;
}

static int block_free(long threads, long ms, size_t chunk, long count)
{
	module_load_fn load = (module_load_fn)sym(lib_handle, "cuModuleLoadData");
	get_function_fn get = (get_function_fn)sym(lib_handle, "cuModuleGetFunction");
	launch_fn launch = (launch_fn)sym(lib_handle, "cuLaunchKernel");
	struct timed_free *f = calloc((size_t)threads, sizeof(*f));
	pthread_t *t = calloc((size_t)threads, sizeof(*t));
	uint64_t ns = (uint64_t)ms * 1000000ULL, t0;
	void *mod = NULL, *fn = NULL, *params[] = { &ns };
	int rc;

	for (long i = 0; i < threads; i++)
		if (mem_alloc(&f[i].ptr, 1 << 20)) {
			say("error small alloc %ld", i);
			return 1;
		}
	rc = load(&mod, SPIN_PTX);
	if (!rc)
		rc = get(&fn, mod, "spin");
	if (!rc)
		rc = launch(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
	if (rc) {
		say("kernel unavailable rc=%d", rc);
		return 3;
	}
	t0 = now_ns();
	say("kernel launched ms=%ld", ms);
	for (long i = 0; i < threads; i++)
		pthread_create(&t[i], NULL, blocked_free, &f[i]);
	usleep(200 * 1000); /* the frees are in flight (blocked if the driver waits) */
	for (long i = 0; i < count; i++) {
		uint64_t p = 0, a = now_ns();
		int r = mem_alloc(&p, chunk);

		say("alloc %ld %s after_ms=%.1f took_ms=%.1f", i, r ? "failed" : "done",
		    (double)(now_ns() - t0) / 1e6, (double)(now_ns() - a) / 1e6);
	}
	for (long i = 0; i < threads; i++)
		pthread_join(t[i], NULL);
	for (long i = 0; i < threads; i++)
		say("free %ld rc=%d took_ms=%.1f", i, f[i].rc, (double)f[i].took / 1e6);
	say("done");
	return 0;
}

/* ---- races on what the return probe reads ---- */

static volatile uint64_t slot;
static volatile size_t pitch_slot;
static volatile uint64_t old_ptr;
static volatile int racing = 1;

static void *rewrite_ptr(void *unused)
{
	(void)unused;
	while (racing) {
		uint64_t v = slot;

		if (v && v != old_ptr)
			slot = old_ptr;
	}
	return NULL;
}

static void *rewrite_pitch(void *unused)
{
	(void)unused;
	while (racing)
		if (pitch_slot)
			pitch_slot = 0;
	return NULL;
}

static int race_ptr(size_t chunk, long count)
{
	pthread_t t;
	uint64_t first = 0;

	if (mem_alloc(&first, chunk)) {
		say("error first alloc");
		return 1;
	}
	say("alloc 0 ok");
	old_ptr = first;
	pthread_create(&t, NULL, rewrite_ptr, NULL);
	for (long i = 1; i <= count; i++) {
		int rc;

		slot = old_ptr;
		rc = mem_alloc((uint64_t *)&slot, chunk);
		if (rc)
			say("alloc %ld rc=%d", i, rc);
		else
			say("alloc %ld ok", i);
	}
	racing = 0;
	pthread_join(t, NULL);
	say("done");
	return 0;
}

static int race_pitch(size_t width, size_t height, long count)
{
	pthread_t t;

	pthread_create(&t, NULL, rewrite_pitch, NULL);
	for (long i = 0; i < count; i++) {
		uint64_t p = 0;
		int rc;

		pitch_slot = 0;
		rc = mem_alloc_pitch(&p, (size_t *)&pitch_slot, width, height, 4);
		if (rc)
			say("alloc %ld rc=%d", i, rc);
		else
			say("alloc %ld ok", i);
	}
	racing = 0;
	pthread_join(t, NULL);
	say("done");
	return 0;
}

/* ---- cgroup churn ---- */

static int move_to(const char *dir)
{
	char path[4096];
	int fd, ok;

	snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ok = write(fd, "0", 1) == 1; /* 0: the writing process, whatever its PID namespace */
	close(fd);
	return ok ? 0 : -1;
}

static int churn(const char *base, long n, size_t chunk, int keep, long hold_every)
{
	char dir[4096], prev[4096] = "";
	uint64_t pending = 0;

	for (long i = 0; i < n; i++) {
		uint64_t p = 0;

		snprintf(dir, sizeof(dir), "%s/c%ld", base, i);
		if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
			say("error mkdir %ld errno=%d", i, errno);
			return 1;
		}
		if (move_to(dir) != 0) {
			say("error move %ld errno=%d", i, errno);
			return 1;
		}
		if (prev[0])
			rmdir(prev); /* empty now: this process just left it */
		if (pending) {
			/* Held across the move and the removal: its cgroup is pruned at this free. */
			mem_free(pending);
			pending = 0;
		}
		if (mem_alloc(&p, chunk)) {
			say("alloc %ld failed", i);
			return 1;
		}
		if (hold_every > 0 && i % hold_every == 0)
			pending = p;
		else
			mem_free(p);
		say("cgroup %ld ok", i);
		snprintf(prev, sizeof(prev), "%s", keep ? "" : dir);
	}
	if (move_to(base) == 0 && prev[0])
		rmdir(prev);
	if (pending)
		mem_free(pending);
	say("churned %ld", n);
	return 0;
}

/* ---- allocations held across cgroups ---- */

/* Makes DIR/s<k>, moves there and allocates CHUNK bytes PER times, numbering from *n. */
static int spread_into(const char *base, long k, long per, size_t chunk, long *n)
{
	char dir[4096];

	snprintf(dir, sizeof(dir), "%s/s%ld", base, k);
	if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
		say("error mkdir %ld errno=%d", k, errno);
		return 1;
	}
	if (move_to(dir) != 0) {
		say("error move %ld errno=%d", k, errno);
		return 1;
	}
	for (long i = 0; i < per; i++, (*n)++) {
		uint64_t p = 0;
		int rc = mem_alloc(&p, chunk);

		if (rc) {
			say("alloc %ld rc=%d", *n, rc);
			return 1;
		}
		say("alloc %ld ok", *n);
	}
	return 0;
}

static int spread(const char *base, long k, long per, size_t chunk)
{
	char line[64];
	long n = 0;

	for (long i = 0; i < k; i++)
		if (spread_into(base, i, per, chunk, &n))
			return 1;
	say("held %ld", n);
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	if (spread_into(base, k, per, chunk, &n))
		return 1;
	say("done");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: see hostile.c\n");
		return 2;
	}
	open_driver();
	if (!strcmp(argv[1], "park") && argc == 5)
		return park(atol(argv[2]), strtoull(argv[3], NULL, 0), atol(argv[4]));
	if (!strcmp(argv[1], "block-free") && argc == 6)
		return block_free(atol(argv[2]), atol(argv[3]), strtoull(argv[4], NULL, 0),
				  atol(argv[5]));
	if (!strcmp(argv[1], "race-ptr") && argc == 4)
		return race_ptr(strtoull(argv[2], NULL, 0), atol(argv[3]));
	if (!strcmp(argv[1], "race-pitch") && argc == 5)
		return race_pitch(strtoull(argv[2], NULL, 0), strtoull(argv[3], NULL, 0),
				  atol(argv[4]));
	if (!strcmp(argv[1], "churn") && argc >= 5) {
		int keep = argc > 5 && !strcmp(argv[5], "keep");
		long every = argc > 6 && !strcmp(argv[5], "hold-every") ? atol(argv[6]) : 0;

		return churn(argv[2], atol(argv[3]), strtoull(argv[4], NULL, 0), keep, every);
	}
	if (!strcmp(argv[1], "spread") && argc == 6)
		return spread(argv[2], atol(argv[3]), atol(argv[4]), strtoull(argv[5], NULL, 0));
	fprintf(stderr, "unknown command %s\n", argv[1]);
	return 2;
}
