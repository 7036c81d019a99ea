//! `cargo xtask fuzz`: every fuzz target in `fuzz/` for a bounded time each (`fuzz/run.sh`),
//! failing on a crash. `cargo xtask test` runs it for [`CI_SECONDS`] per target.

use anyhow::Result;
use clap::Args;

use crate::util::{exec, root, step};

/// Seconds per target in `cargo xtask test` (CI).
pub const CI_SECONDS: u32 = 20;

#[derive(Debug, Args)]
pub struct FuzzArgs {
    /// Seconds to run each target.
    #[arg(long, default_value_t = 60)]
    seconds: u32,

    /// Keep what the run finds in fuzz/corpus/TARGET (to commit after a recorded run).
    #[arg(long)]
    write_corpus: bool,

    /// Targets to run (default: all of frame, hello, request, target).
    targets: Vec<String>,
}

pub fn run(args: &FuzzArgs) -> Result<()> {
    fuzz(args.seconds, args.write_corpus, &args.targets)
}

/// Builds the instrumented targets and runs each for `seconds`, one at a time.
pub fn fuzz(seconds: u32, write_corpus: bool, targets: &[String]) -> Result<()> {
    step(&format!(
        "fuzzing ({seconds} s per target, fuzz/run.sh; crashes fail)"
    ));
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(root().join("fuzz").join("run.sh"))
        .arg(seconds.to_string())
        .args(targets);
    if write_corpus {
        cmd.env("FUZZ_WRITE_CORPUS", "1");
    }
    exec(&mut cmd)
}
