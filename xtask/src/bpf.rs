//! `cargo xtask bpf`: compile the eBPF C sources into the committed object.
//!
//! Reproducible: the compiler runs inside `fgpu-ebpf/src/bpf` on relative paths with the
//! debug prefix mapped to `.`, and DWARF is stripped (BTF, which aya needs, is kept), so no
//! path of the machine that built it ends up in the object.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::util::{exec, find_tool, root, step};

#[derive(Debug, Args)]
pub struct BpfArgs {
    /// Compile into a temporary file and fail if it differs from the committed object.
    #[arg(long)]
    check: bool,
}

const SOURCE: &str = "fgpu.bpf.c";

pub fn src_dir() -> PathBuf {
    root().join("fgpu-ebpf").join("src").join("bpf")
}

pub fn object_path() -> PathBuf {
    root().join("fgpu-ebpf").join("out").join("fgpu.bpf.o")
}

pub fn run(args: &BpfArgs) -> Result<()> {
    if args.check {
        check()
    } else {
        step("compiling the eBPF object");
        compile(&object_path())?;
        println!("wrote {}", object_path().display());
        Ok(())
    }
}

/// Rebuilds into a temporary file and compares it with the committed object.
pub fn check() -> Result<()> {
    step("eBPF object matches its sources");
    let tmp = std::env::temp_dir().join(format!("fgpu-bpf-check-{}.o", std::process::id()));
    compile(&tmp)?;
    let fresh = std::fs::read(&tmp)?;
    let _ = std::fs::remove_file(&tmp);
    let committed = std::fs::read(object_path())
        .with_context(|| format!("reading {}", object_path().display()))?;
    if fresh != committed {
        bail!(
            "{} differs from what its sources compile to ({} vs {} bytes): run `cargo xtask \
             bpf` and commit the object with the sources",
            object_path().display(),
            committed.len(),
            fresh.len()
        );
    }
    println!(
        "ok: {} is up to date ({} bytes)",
        object_path().display(),
        fresh.len()
    );
    Ok(())
}

fn compile(out: &Path) -> Result<()> {
    let clang = find_tool(&["clang-19"]).context(
        "clang-19 not found: install it (`apt-get install clang-19 llvm-19 libbpf-dev`)",
    )?;
    let strip = find_tool(&["llvm-strip-19", "llvm-strip"])
        .context("llvm-strip not found: install it (`apt-get install llvm-19`)")?;
    let arch_include = Path::new("/usr/include/x86_64-linux-gnu");
    if !arch_include.join("asm").is_dir() {
        bail!(
            "{}/asm is missing: install linux-libc-dev",
            arch_include.display()
        );
    }
    if !Path::new("/usr/include/bpf/bpf_helpers.h").is_file() {
        bail!("/usr/include/bpf/bpf_helpers.h is missing: install libbpf-dev");
    }
    let dir = src_dir();
    let unstripped = out.with_extension("unstripped.o");
    exec(
        Command::new(&clang)
            .current_dir(&dir)
            .args(fgpu_ebpf::CLANG_FLAGS)
            .arg(format!("-I{}", arch_include.display()))
            .arg(format!("-fdebug-prefix-map={}=.", dir.display()))
            .arg("-fdebug-compilation-dir=.")
            .args(["-c", SOURCE, "-o"])
            .arg(&unstripped),
    )?;
    exec(
        Command::new(&strip)
            .arg("-g")
            .arg(&unstripped)
            .arg("-o")
            .arg(out),
    )?;
    std::fs::remove_file(&unstripped)?;
    Ok(())
}
