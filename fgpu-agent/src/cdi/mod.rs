//! `fgpu cdi`: fgpu for container runtimes through CDI (docker >= 28.2, podman >= 4.1,
//! containerd with `enable_cdi`, CRI-O). `generate` writes the spec whose devices
//! (`fgpu.io/gpu=0|UUID|all`) inject the shim, the containers' socket and a `createRuntime`
//! hook; `hook` is that hook, run by the runtime on the host. docs/containers.md.

pub(crate) mod generate;
pub mod hook;
pub mod spec;

use anyhow::Result;
use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct CdiArgs {
    #[command(subcommand)]
    command: CdiCommand,
}

#[derive(Debug, Subcommand)]
enum CdiCommand {
    /// Write the CDI spec for this node: devices KIND=all, KIND=INDEX and KIND=UUID (see
    /// docs/containers.md). Put it in /etc/cdi or /var/run/cdi; then e.g.
    /// `podman run --device fgpu.io/gpu=0 -e FGPU_MEMORY_LIMIT=8GiB IMAGE`.
    Generate(generate::GenerateArgs),
    /// The OCI createRuntime hook that fgpu's CDI spec installs (run by the container runtime
    /// on the host, with the container's state on stdin): registers the limit the container
    /// asks for (FGPU_MEMORY_LIMIT, GPU_MEM_LIMIT_GB, FGPU_COMPUTE_SHARE) with the agent on
    /// the container's cgroup, until the cgroup is removed. A value that is not a valid limit
    /// refuses the container.
    Hook(hook::HookArgs),
}

pub fn run(args: &CdiArgs) -> Result<()> {
    match &args.command {
        CdiCommand::Generate(a) => generate::run(a),
        CdiCommand::Hook(a) => hook::run(a),
    }
}
