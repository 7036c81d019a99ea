//! Building the workspace and installing the simulated driver.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::util::{cargo, exec, root, step};

/// Where the simulated driver is installed under its real sonames.
pub fn sim_dir() -> PathBuf {
    root().join("target").join("sim")
}

/// The sonames the simulated HIP runtime, ROCm SMI and AMD SMI are installed under.
pub const HIP_SIM_NAMES: [&str; 6] = [
    "libamdhip64.so",
    "libamdhip64.so.7",
    "librocm_smi64.so",
    "librocm_smi64.so.7",
    "libamd_smi.so",
    "libamd_smi.so.26",
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
    // The HIP personality (docs/amd.md): separate copies, so that RTLD_NOLOAD of a CUDA name
    // never finds the HIP library of a process (glibc matches loaded objects by inode).
    for name in crate::build::HIP_SIM_NAMES {
        copy(&lib, &sim.join(name))?;
    }
    for bin in ["fgpu-sim-load", "fgpu-sim-hip"] {
        copy(&profile_dir.join(bin), &sim.join(bin))?;
    }
    println!("simulated driver installed in {}", sim.display());
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
