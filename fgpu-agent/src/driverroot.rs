//! Where the NVIDIA driver's NVML library is under a driver root: the host's `/` mounted into
//! a container (the chart mounts `driverRoot` at `/driver-root`), or the root of a driver
//! installed elsewhere (NVIDIA's GPU operator: `/run/nvidia/driver`). Distributions put
//! `libnvidia-ml.so.1` in different places (Debian and Ubuntu: the multiarch directory;
//! RHEL: `lib64`; NVIDIA's containers and older charts: `/usr/local/nvidia/lib64`), so a
//! fixed directory mounted into the pod (the chart's old `driverDir: /usr/local/nvidia`,
//! `type: Directory`) kept pods from starting on most hosts. Loading it by its full path also
//! keeps the host's other libraries (its libc) out of the process, which an
//! `LD_LIBRARY_PATH` into the host's `/usr/lib` would not.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// The directories under a driver root searched for `libnvidia-ml.so.1`, in order.
pub const LIB_DIRS: [&str; 8] = [
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "lib64",
    "lib",
    "usr/local/nvidia/lib64",
    "usr/local/nvidia/lib",
];

/// `libnvidia-ml.so.1` under `root`, or an error naming where it looked.
pub fn nvml_under(root: &Path) -> Result<PathBuf> {
    if !root.is_dir() {
        bail!("--driver-root {}: not a directory", root.display());
    }
    for d in LIB_DIRS {
        let p = root.join(d).join("libnvidia-ml.so.1");
        if p.exists() {
            return Ok(p);
        }
    }
    bail!(
        "--driver-root {}: no libnvidia-ml.so.1 in {}",
        root.display(),
        LIB_DIRS.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_library_directory_that_has_nvml_wins_and_a_miss_says_where_it_looked() {
        let root = std::env::temp_dir().join(format!("fgpu-driverroot-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for d in ["usr/lib64", "usr/local/nvidia/lib64"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
            std::fs::write(root.join(d).join("libnvidia-ml.so.1"), b"").unwrap();
        }
        assert_eq!(
            nvml_under(&root).unwrap(),
            root.join("usr/lib64/libnvidia-ml.so.1")
        );
        let empty = root.join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let err = nvml_under(&empty).unwrap_err().to_string();
        assert!(
            err.contains("no libnvidia-ml.so.1 in usr/lib/x86_64-linux-gnu"),
            "{err}"
        );
        assert!(nvml_under(&root.join("nowhere")).is_err());
        let _ = std::fs::remove_dir_all(&root);
    }
}
