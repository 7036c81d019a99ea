//! `fgpu`: the node agent (`fgpu agent`) and the command line that talks to it.

mod agent;
mod api;
mod cdi;
mod cli;
mod driverroot;
mod k8s;
mod statefile;
mod status;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Default path of the containers' socket (the shim's default `FGPU_SOCKET`): Hello and the
/// caller's own status only. Its directory is what gets mounted into containers.
pub const DEFAULT_SOCKET: &str = "/run/fgpu/fgpu.sock";
/// Default path of the admin socket (root-only, host-only): limits and the full status.
pub const DEFAULT_ADMIN_SOCKET: &str = "/run/fgpu-admin/fgpu.sock";

#[derive(Debug, Parser)]
#[command(
    name = "fgpu",
    version,
    about = "Share one GPU between containers: per-container memory limits and compute shares.",
    long_about = "fgpu attributes every GPU allocation to the cgroup (container) that made it, \
                  using eBPF uprobes on the driver library, without the workload needing the \
                  host's PID namespace.\n\n\
                  Start the node agent as root with `fgpu agent` (or `fgpu agent --sim` on a \
                  machine without a GPU), then look at usage with `fgpu status`.\n\n\
                  The agent serves two sockets. The containers' socket /run/fgpu/fgpu.sock \
                  (mount its directory and libfgpu.so into containers) answers a shim's Hello \
                  and the caller's own status only. The admin socket \
                  /run/fgpu-admin/fgpu.sock (root-only; never mount it into a container) is \
                  where `fgpu limit` and the node's full `fgpu status` go."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node agent: load the eBPF probes and serve the containers' and the admin socket (needs root).
    Agent(agent::AgentArgs),
    /// Show GPU memory use per cgroup, as the kernel saw it.
    Status(cli::status::StatusArgs),
    /// Set, show and remove per-cgroup GPU limits (memory, compute share).
    Limit(cli::limit::LimitArgs),
    /// Run a command in a fresh cgroup with GPU limits (shim preloaded), then clean up.
    Run(cli::run::RunArgs),
    /// Containers through CDI (docker, podman, containerd, CRI-O): write the CDI spec, and
    /// the hook it installs.
    Cdi(cdi::CdiArgs),
    /// A live view of the containers using the GPUs: memory against limits, compute shares, denials.
    Top(cli::top::TopArgs),
    /// Kubernetes: the DRA kubelet plugin (driver fgpu.io) that turns ResourceClaims'
    /// consumed memory and compute into limits on their pods' cgroups (docs/kubernetes.md).
    KubeletPlugin(k8s::KubeletPluginArgs),
    /// Check this node for what fgpu needs (kernel, cgroups, driver, NVML, the agent's
    /// sockets, CDI spec, kubelet plugin) and say what is wrong and how to fix it.
    #[command(long_about = cli::doctor::LONG_ABOUT)]
    Doctor(cli::doctor::DoctorArgs),
}

fn main() -> std::process::ExitCode {
    // `Cli::parse()`, plus the hidden `fgpu generate` (completions, man pages) beside it.
    let cli = cli::generate::parse();
    let result = match cli.command {
        Command::Agent(args) => agent::run(args),
        Command::Status(args) => cli::status::run(&args),
        Command::Limit(args) => cli::limit::run(&args),
        Command::Cdi(args) => cdi::run(&args),
        Command::Top(args) => cli::top::run(&args),
        Command::KubeletPlugin(args) => k8s::run(&args),
        Command::Doctor(args) => match cli::doctor::run(&args) {
            Ok(code) => return code,
            Err(err) => Err(err),
        },
        Command::Run(args) => match cli::run::run(&args) {
            Ok(code) => return code,
            Err(err) => Err(err),
        },
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("fgpu: error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Where the CLI sends its requests: `--socket`, else `$FGPU_ADMIN_SOCKET`, else the admin
/// socket at its default path unless that does not exist (inside a container), else the
/// containers' socket (`$FGPU_SOCKET` or its default), which answers `fgpu status` with the
/// caller's own row and refuses the rest.
pub fn socket_path(flag: Option<PathBuf>) -> PathBuf {
    if let Some(path) = flag.or_else(|| std::env::var_os("FGPU_ADMIN_SOCKET").map(PathBuf::from)) {
        return path;
    }
    let admin = PathBuf::from(DEFAULT_ADMIN_SOCKET);
    match std::fs::symlink_metadata(&admin) {
        // Not there: we are not on the agent's host (or no agent runs).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => containers_socket(),
        // There, or there but not ours to look at (not root): connecting says which.
        _ => admin,
    }
}

/// The containers' socket as a shim finds it: `$FGPU_SOCKET`, else the default.
pub fn containers_socket() -> PathBuf {
    std::env::var_os("FGPU_SOCKET").map_or_else(|| PathBuf::from(DEFAULT_SOCKET), PathBuf::from)
}
