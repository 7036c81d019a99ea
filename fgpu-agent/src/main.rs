//! `fgpu`: the node agent (`fgpu agent`) and the command line that talks to it.

mod agent;
mod api;
mod cli;
mod status;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Default path of the agent's control socket.
pub const DEFAULT_SOCKET: &str = "/run/fgpu/fgpu.sock";

#[derive(Debug, Parser)]
#[command(
    name = "fgpu",
    version,
    about = "Share one GPU between containers: per-container memory limits and compute shares.",
    long_about = "fgpu attributes every GPU allocation to the cgroup (container) that made it, \
                  using eBPF uprobes on the driver library, without the workload needing the \
                  host's PID namespace.\n\n\
                  Start the node agent as root with `fgpu agent` (or `fgpu agent --sim` on a \
                  machine without a GPU), then look at usage with `fgpu status`."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node agent: load the eBPF probes and serve the control socket (needs root).
    Agent(agent::AgentArgs),
    /// Show GPU memory use per cgroup, as the kernel saw it.
    Status(cli::status::StatusArgs),
    /// Set, show and remove per-cgroup GPU limits (memory, compute share).
    Limit(cli::limit::LimitArgs),
    /// Run a command in a fresh cgroup with GPU limits (shim preloaded), then clean up.
    Run(cli::run::RunArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Agent(args) => agent::run(args),
        Command::Status(args) => cli::status::run(&args),
        Command::Limit(args) => cli::limit::run(&args),
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

/// Where the CLI finds the agent: `--socket`, else `$FGPU_SOCKET`, else the default.
pub fn socket_path(flag: Option<PathBuf>) -> PathBuf {
    flag.or_else(|| std::env::var_os("FGPU_SOCKET").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET))
}
