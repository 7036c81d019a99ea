//! Small helpers shared by the tasks.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The workspace root (the parent of this crate's directory).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

/// The cargo that runs us (so a toolchain chosen by rustup is kept).
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

/// Runs a command to completion, failing with the command line if it fails.
pub fn exec(cmd: &mut Command) -> Result<()> {
    let line = format!("{cmd:?}");
    let status = cmd.status().with_context(|| format!("starting {line}"))?;
    if !status.success() {
        bail!("{line} failed ({status})");
    }
    Ok(())
}

/// Prints a step header, the way every task reports progress.
pub fn step(what: &str) {
    println!("\n==> [{}] {what}", elapsed());
}

/// Time since this xtask started, `m:ss` (so that a CI log shows where its minutes go).
fn elapsed() -> String {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let s = START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs();
    format!("{}:{:02}", s / 60, s % 60)
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The first of `names` found on PATH.
pub fn find_tool(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|name| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}
