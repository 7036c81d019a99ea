//! `cargo xtask run`: build and start the agent.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use anyhow::{Result, bail};
use clap::Args;

use crate::build::{release, sim_dir};
use crate::util::{is_root, step};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Use the simulated driver (target/sim) instead of the host's GPU driver.
    #[arg(long)]
    sim: bool,

    /// Extra arguments for `fgpu agent` (after `--`), e.g. `-- --log debug`.
    #[arg(last = true)]
    agent_args: Vec<String>,
}

pub fn run(args: &RunArgs) -> Result<()> {
    if !args.sim && !gpu_present() {
        bail!(
            "no NVIDIA GPU found on this machine (no /dev/nvidiactl and no libcuda.so.1): \
             try the simulated driver with `cargo xtask run --sim`"
        );
    }
    if !is_root() {
        bail!(
            "the agent loads eBPF programs and must run as root: \
             `sudo -E cargo xtask run{}`",
            if args.sim { " --sim" } else { "" }
        );
    }
    let dir = release()?;
    let fgpu = dir.join("fgpu");
    step(&format!(
        "starting {} agent{} (Ctrl-C stops it)",
        fgpu.display(),
        if args.sim { " --sim" } else { "" }
    ));
    if args.sim {
        println!(
            "try it from another shell:\n  \
             {sim}/fgpu-sim-load --lib {sim}/libcuda.so.1 alloc 256MiB alloc 256MiB sleep 60000 &\n  \
             sudo {fgpu} status",
            sim = sim_dir().display(),
            fgpu = fgpu.display()
        );
    }
    let mut cmd = Command::new(&fgpu);
    cmd.arg("agent");
    if args.sim {
        cmd.arg("--sim").env("FGPU_SIM_DIR", sim_dir());
    }
    cmd.args(&args.agent_args);
    let err = cmd.exec();
    bail!("starting {}: {err}", fgpu.display())
}

fn gpu_present() -> bool {
    Path::new("/dev/nvidiactl").exists()
        || [
            "/usr/local/nvidia/lib64/libcuda.so.1",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "/usr/lib64/libcuda.so.1",
        ]
        .iter()
        .any(|p| Path::new(p).exists())
}
