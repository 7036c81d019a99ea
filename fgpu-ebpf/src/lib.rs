//! fgpu's eBPF programs, compiled from `src/bpf/fgpu.bpf.c` by clang-19 into
//! `out/fgpu.bpf.o` and committed, so that a plain `cargo build` needs no clang.
//!
//! `cargo xtask bpf` rebuilds the object; `cargo xtask test` rebuilds it into a temporary
//! file and fails if it differs from the committed one by a single byte.
//!
//! Programs in the object:
//! - [`PROG_ENTER`] (`uprobe`): on entry to every probed driver function; stores arguments.
//! - [`PROG_LEAVE`] (`uretprobe`): on return; charges or credits successful calls, and
//!   SIGKILLs (or reports) a process whose allocation takes a limited cgroup past its limit.
//! - [`PROG_EXIT`] (`tracepoint/sched/sched_process_exit`): releases a dead process's bytes.
//! - [`PROG_EXEC`] (`tracepoint/sched/sched_process_exec`): tells the agent a process started,
//!   so it can look for driver libraries in it.
//! - [`PROG_CGROUP_RMDIR`] (`tracepoint/cgroup/cgroup_rmdir`): prunes a removed cgroup's
//!   records from every cgroup-keyed map, so that they bound live cgroups, not all ever seen.
//! - [`PROG_CGROUP_MKDIR`] (`tracepoint/cgroup/cgroup_mkdir`): tells the agent of cgroups
//!   made directly under the root or under a shared parent, which it may mark shared.

/// Name of the entry uprobe program.
pub const PROG_ENTER: &str = "fgpu_enter";
/// Name of the return uprobe program.
pub const PROG_LEAVE: &str = "fgpu_leave";
/// Name of the process-exit tracepoint program.
pub const PROG_EXIT: &str = "fgpu_sched_exit";
/// Name of the exec tracepoint program.
pub const PROG_EXEC: &str = "fgpu_sched_exec";
/// Name of the cgroup-removal tracepoint program.
pub const PROG_CGROUP_RMDIR: &str = "fgpu_cgroup_rmdir";
/// Name of the cgroup-creation tracepoint program.
pub const PROG_CGROUP_MKDIR: &str = "fgpu_cgroup_mkdir";

/// Maps in the object (see the header comment of `fgpu.bpf.c`).
pub mod maps {
    pub const ALLOCS: &str = "allocs";
    pub const CG_USAGE: &str = "cg_usage";
    pub const PROCS: &str = "procs";
    pub const TREE_USAGE: &str = "tree_usage";
    pub const CG_TREE: &str = "cg_tree";
    pub const LIMITS: &str = "limits";
    pub const TENANTS: &str = "tenants";
    pub const SHARED: &str = "shared";
    pub const SHARED_PATHS: &str = "shared_paths";
    pub const COUNTERS: &str = "counters";
    pub const EVENTS: &str = "events";
}

/// The compiler flags `cargo xtask bpf` uses; kept here so that the flags and the object
/// they produced are reviewed together.
pub const CLANG_FLAGS: &[&str] = &[
    "-O2",
    "-g",
    "-target",
    "bpf",
    "-D__TARGET_ARCH_x86",
    "-Wall",
    "-Werror",
];

#[repr(C, align(64))]
struct Aligned<B: ?Sized>(B);

static OBJECT: &Aligned<[u8]> = &Aligned(*include_bytes!("../out/fgpu.bpf.o"));

/// The compiled eBPF object (ELF), aligned for parsing in place.
pub fn object() -> &'static [u8] {
    &OBJECT.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_is_a_bpf_elf_with_our_programs() {
        let obj = object();
        assert_eq!(&obj[..4], b"\x7fELF");
        assert_eq!(obj[4], 2, "64-bit ELF");
        // e_machine at offset 18: EM_BPF = 247.
        assert_eq!(u16::from_le_bytes([obj[18], obj[19]]), 247);
        for name in [
            PROG_ENTER,
            PROG_LEAVE,
            PROG_EXIT,
            maps::EVENTS,
            maps::CG_USAGE,
            maps::LIMITS,
            maps::TREE_USAGE,
        ] {
            assert!(
                obj.windows(name.len()).any(|w| w == name.as_bytes()),
                "{name} missing from the object"
            );
        }
    }
}
