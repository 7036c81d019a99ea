//! `cargo xtask device-bundle`: what the GPU machine needs, stripped, in one folder.
//!
//! Layout: `bin/fgpu`, `lib/libfgpu.so`, `sim/` (the simulated driver, for comparison
//! runs), `bench/` and `tests/gpu/` (the GPU scripts), and `MANIFEST` (commit, sizes).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::build::release;
use crate::util::{exec, find_tool, root, step};

/// The device tool carries at most this much.
const LIMIT: u64 = 20 << 20;

#[derive(Debug, Args)]
pub struct BundleArgs {
    /// Folder to write (replaced if it exists). Keep it git-ignored and name it in `carry`.
    #[arg(long, default_value = "bundle")]
    out: PathBuf,
}

pub fn run(args: &BundleArgs) -> Result<()> {
    let release_dir = release()?;
    let out = if args.out.is_absolute() {
        args.out.clone()
    } else {
        root().join(&args.out)
    };
    step(&format!("assembling {}", out.display()));
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("removing {}", out.display()))?;
    }
    let strip = find_tool(&["strip"]).context("`strip` not found: install binutils")?;
    let binaries = [
        ("fgpu", "bin/fgpu"),
        ("fgpu-test-kubelet", "bin/fgpu-test-kubelet"),
        ("libfgpu.so", "lib/libfgpu.so"),
        ("libfgpu_sim.so", "sim/libcuda.so.1"),
        ("libfgpu_sim.so", "sim/libnvidia-ml.so.1"),
        ("fgpu-sim-load", "sim/fgpu-sim-load"),
    ];
    for (from, to) in binaries {
        let dest = out.join(to);
        std::fs::create_dir_all(dest.parent().expect("bundle paths have a parent"))?;
        std::fs::copy(release_dir.join(from), &dest)
            .with_context(|| format!("copying {from} (was it built?)"))?;
        exec(Command::new(&strip).arg("--strip-unneeded").arg(&dest))?;
    }
    for dir in ["bench", "tests/gpu"] {
        copy_tree(&root().join(dir), &out.join(dir))?;
    }
    let commit = Command::new("git")
        .current_dir(root())
        .args(["describe", "--always", "--dirty"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let total = tree_size(&out)?;
    std::fs::write(
        out.join("MANIFEST"),
        format!("commit {commit}\nbytes {total}\n"),
    )?;
    println!(
        "{}: {:.1} MiB, commit {commit}",
        out.display(),
        total as f64 / (1 << 20) as f64
    );
    if total > LIMIT {
        bail!("the bundle is {total} bytes, over the 20 MiB the device tool carries");
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    if !from.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let dest = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &dest)?;
        } else {
            std::fs::copy(entry.path(), &dest)?;
        }
    }
    Ok(())
}

fn tree_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            tree_size(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}
