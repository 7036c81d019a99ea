//! Building the workspace and installing the simulated driver.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::util::{cargo, exec, root, step};

/// Where the simulated driver is installed under its real sonames.
pub fn sim_dir() -> PathBuf {
    root().join("target").join("sim")
}

/// The simulated HIP runtime, ROCm SMI and AMD SMI: (the file, its development symlink),
/// as ROCm installs them (`libamdhip64.so -> libamdhip64.so.7`).
pub const HIP_SIM_NAMES: [(&str, &str); 3] = [
    ("libamdhip64.so.7", "libamdhip64.so"),
    ("librocm_smi64.so.7", "librocm_smi64.so"),
    ("libamd_smi.so.26", "libamd_smi.so"),
];

/// `cargo build --release` of the workspace, then the sim installed into target/sim.
/// Returns the release directory.
pub fn release() -> Result<PathBuf> {
    step("cargo build --release");
    exec(cargo().args(["build", "--release", "--workspace", "--exclude", "xtask"]))?;
    let dir = root().join("target").join("release");
    install_sim(&dir)?;
    Ok(dir)
}

/// Copies the sim's cdylib and load generator from `profile_dir` into target/sim.
pub fn install_sim(profile_dir: &Path) -> Result<()> {
    let sim = sim_dir();
    std::fs::create_dir_all(&sim).with_context(|| format!("creating {}", sim.display()))?;
    let lib = profile_dir.join("libfgpu_sim.so");
    for name in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        copy(&lib, &sim.join(name))?;
    }
    // The HIP personality (docs/amd.md): a copy of its own per library, so that RTLD_NOLOAD
    // of a CUDA name never finds the HIP library of a process (glibc matches loaded objects
    // by inode); each under its soname with the unversioned name a symlink to it, as a real
    // ROCm install has them: a program that loads either name maps one file, the one the
    // agent's probes are on (before, two copies: a program loading `libamdhip64.so` was never
    // seen by probes on `libamdhip64.so.7`).
    for (file, link) in crate::build::HIP_SIM_NAMES {
        copy(&lib, &sim.join(file))?;
        symlink(file, &sim.join(link))?;
    }
    for bin in ["fgpu-sim-load", "fgpu-sim-hip"] {
        copy(&profile_dir.join(bin), &sim.join(bin))?;
    }
    println!("simulated driver installed in {}", sim.display());
    Ok(())
}

/// `link` made (or replaced) as a relative symlink to `target`.
fn symlink(target: &str, link: &Path) -> Result<()> {
    let tmp = link.with_extension("tmp-link");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)
        .with_context(|| format!("linking {} to {target}", tmp.display()))?;
    std::fs::rename(&tmp, link).with_context(|| format!("renaming to {}", link.display()))?;
    Ok(())
}

/// Copies through a temporary name so that a running process mapping the old file keeps
/// its inode.
pub fn copy(from: &Path, to: &Path) -> Result<()> {
    let tmp = to.with_extension("tmp-copy");
    std::fs::copy(from, &tmp)
        .with_context(|| format!("copying {} to {}", from.display(), tmp.display()))?;
    std::fs::rename(&tmp, to).with_context(|| format!("renaming to {}", to.display()))?;
    Ok(())
}
