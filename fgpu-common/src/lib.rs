//! Types shared by the fgpu agent, its CLI and the shim.
//!
//! Nothing here does I/O or starts threads: the shim links this crate into other people's
//! processes, and the agent and CLI use it to agree on formats.
//!
//! - [`clock`]: the one monotonic clock (`CLOCK_MONOTONIC` ns) every part reads.
//! - [`quantity`]: the SIZE (`8GiB`, `512MiB`, `8GB`, bytes) and PCT (`30%`) forms of the CLI
//!   and the environment.
//! - [`event`]: the records the eBPF programs write, mirrored from `fgpu-ebpf/src/bpf/fgpu.h`.
//! - [`cgroup`]: cgroup v2 paths from `/proc/PID/cgroup`; [`cgroup::naming`]: the container
//!   (docker, podman, containerd, CRI-O), Kubernetes pod and QoS class a path names, and the
//!   names the kubelet gives a pod's cgroup.
//! - [`proto`]: framing of the agent's unix-socket protocol.
//! - [`inert`]: text a tenant chose (cgroup names, what it writes in its usage page) made
//!   inert for terminals and text logs: control and invisible format characters escaped.

pub mod cgroup;
pub mod clock;
pub mod event;
pub mod inert;
pub mod ledger;
pub mod proto;
pub mod quantity;
