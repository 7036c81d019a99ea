//! `cargo xtask`: build, run, test and bundle fgpu. `cargo xtask --help` lists the tasks.

mod bench;
mod bpf;
mod build;
mod bundle;
mod fuzz;
mod run;
mod test;
mod util;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "Build, run, test and bundle fgpu.")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Release build of the workspace, and the simulated driver installed as
    /// target/sim/libcuda.so.1 and target/sim/libnvidia-ml.so.1.
    Build,
    /// Build, then start the agent as root (`--sim`: on the simulated driver).
    Run(run::RunArgs),
    /// Everything CI checks: fmt, clippy, the eBPF object, unit and privileged end-to-end tests.
    Test(test::TestArgs),
    /// Kernel-accounting benchmark on the simulated driver: cost per alloc/free pair with the
    /// probes attached, and events per second without loss (needs root).
    Bench(bench::BenchArgs),
    /// Run the fuzz targets (fuzz/: frame decoder, Hello, control requests, TARGETs) for a
    /// bounded time each; fails on a crash.
    Fuzz(fuzz::FuzzArgs),
    /// Rebuild fgpu-ebpf/out/fgpu.bpf.o from the C sources with clang-19 (`--check`: compare only).
    Bpf(bpf::BpfArgs),
    /// Stripped release binaries, the simulated driver and the GPU scripts in one folder
    /// (default `bundle/`, under 20 MiB), to carry to the GPU machine.
    DeviceBundle(bundle::BundleArgs),
}

fn main() -> std::process::ExitCode {
    let result = match Cli::parse().task {
        Task::Build => build::release().map(|_| ()),
        Task::Run(args) => run::run(&args),
        Task::Test(args) => test::run(&args),
        Task::Bench(args) => bench::run(&args),
        Task::Bpf(args) => bpf::run(&args),
        Task::Fuzz(args) => fuzz::run(&args),
        Task::DeviceBundle(args) => bundle::run(&args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
