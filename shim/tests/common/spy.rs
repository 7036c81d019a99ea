//! A spy driver for the compute tests: a small C library, built with `cc` at test time,
//! installed as the world's `libcuda.so.1`. It depends on fgpu-sim (DT_NEEDED), so every
//! entry point it does not define is the simulator's; it defines `cuEventCreate` and
//! `cuEventRecord` only. The shim resolves its driver helpers with `dlsym` on the
//! `libcuda.so.1` handle, so its event calls go through the spy; the client's own calls
//! (through `cuGetProcAddress_v2`) go to the simulator directly.
//!
//! The spy counts events created and recorded, and — what the simulator does not check —
//! records into a stream that is capturing (`cuStreamIsCapturing` says so, or fails): those
//! are refused with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900), like unsafe calls during a
//! real capture, and counted. At exit it prints one line on stderr:
//! `spy events_created=N timing_events=N events_recorded=N records_into_capture=N`.

use super::{World, target_dir};
use std::path::Path;
use std::process::Command;

const SPY_C: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdatomic.h>

typedef int CUresult;
static atomic_long created, timing, recorded, into_capture;

static void *sim(void) {
    static void *h;
    if (!h) h = dlopen(SIM_PATH, RTLD_NOW | RTLD_NOLOAD);
    return h;
}

CUresult cuEventCreate(void **ev, unsigned flags) {
    static CUresult (*f)(void **, unsigned);
    if (!f) f = (CUresult (*)(void **, unsigned))dlsym(sim(), "cuEventCreate");
    atomic_fetch_add(&created, 1);
    if (!(flags & 2)) atomic_fetch_add(&timing, 1);
    return f(ev, flags);
}

CUresult cuEventRecord(void *ev, void *stream) {
    static CUresult (*f)(void *, void *);
    static CUresult (*cap)(void *, int *);
    if (!f) f = (CUresult (*)(void *, void *))dlsym(sim(), "cuEventRecord");
    if (!cap) cap = (CUresult (*)(void *, int *))dlsym(sim(), "cuStreamIsCapturing");
    int st = 0;
    if (cap(stream, &st) != 0 || st != 0) {
        atomic_fetch_add(&into_capture, 1);
        return 900;
    }
    atomic_fetch_add(&recorded, 1);
    return f(ev, stream);
}

__attribute__((destructor)) static void report(void) {
    fprintf(stderr, "spy events_created=%ld timing_events=%ld events_recorded=%ld records_into_capture=%ld\n",
            (long)created, (long)timing, (long)recorded, (long)into_capture);
}
"#;

/// Replaces the world's `libcuda.so.1` with the spy. Panics if no C compiler is found
/// (set `CC`): the capture test is meaningless without it.
pub fn install(w: &World) {
    let sim = target_dir().join("libfgpu_sim.so");
    let src = w.libdir.join("spy.c");
    std::fs::write(&src, SPY_C).unwrap();
    let out = w.libdir.join("libcuda.so.1");
    let _ = std::fs::remove_file(&out);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&out)
        .arg(format!("-DSIM_PATH=\"{}\"", sim.display()))
        .arg(&src)
        .arg("-Wl,--no-as-needed")
        .arg(&sim)
        .arg("-ldl")
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler '{cc}' for the spy driver: {e}"));
    assert!(st.success(), "building the spy driver failed");
    assert!(Path::new(&out).exists());
}

/// The spy's counters from a process's stderr: (created, timing, recorded, into_capture).
pub fn counts(stderr: &str) -> (u64, u64, u64, u64) {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("spy "))
        .unwrap_or_else(|| panic!("no spy line in:\n{stderr}"));
    let f = |k: &str| super::field(line, k);
    (
        f("events_created"),
        f("timing_events"),
        f("events_recorded"),
        f("records_into_capture"),
    )
}
