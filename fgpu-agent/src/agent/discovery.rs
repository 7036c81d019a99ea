//! Finding the driver libraries to probe.
//!
//! Sources: `--libcuda` paths given by the operator, the dynamic linker's cache
//! (`ldconfig -p`), the directories NVIDIA's container toolkit and the distributions
//! install into, and the libraries processes have actually mapped (`/proc/PID/maps`, opened
//! through `/proc/PID/root` so a container's own copy is reached in its own file system).
//! Every file is identified by (device, inode): the same library reached through two paths
//! (a symlink, a bind mount, two containers sharing an image layer) is probed once.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use fgpu_common::event::Driver;

/// The CUDA driver library's soname.
pub const LIBCUDA: &str = "libcuda.so.1";

/// Directories searched besides the ldconfig cache.
const LIB_DIRS: &[&str] = &[
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
];

/// A library file to attach to, named by the first path it was found under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Library {
    pub path: PathBuf,
    pub driver: Driver,
    pub dev: u64,
    pub ino: u64,
}

/// Keeps the first path of each (device, inode); later paths to the same file are dropped.
#[derive(Debug, Default)]
pub struct Dedup {
    seen: HashSet<(u64, u64)>,
}

impl Dedup {
    /// Returns the library if `path` names a regular file not seen before.
    pub fn admit(&mut self, path: &Path, driver: Driver) -> Option<Library> {
        let meta = std::fs::metadata(path).ok()?;
        if !meta.is_file() {
            return None;
        }
        self.seen.insert((meta.dev(), meta.ino())).then(|| Library {
            path: path.to_path_buf(),
            driver,
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }
}

/// Candidate driver libraries installed on this host, not yet deduplicated.
pub fn system_candidates() -> Vec<(PathBuf, Driver)> {
    let mut out = ldconfig_paths();
    for dir in LIB_DIRS {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if let Some(driver) = Driver::of_file_name(&name) {
                out.push((entry.path(), driver));
            }
        }
    }
    out
}

/// Driver libraries that process `pid` has mapped, as paths through its root directory.
pub fn mapped_by(pid: u32) -> Vec<(PathBuf, Driver)> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map(|maps| {
            parse_maps(&maps)
                .into_iter()
                .map(|(path, driver)| {
                    let inside = path.strip_prefix("/").unwrap_or(&path);
                    (
                        Path::new("/proc")
                            .join(pid.to_string())
                            .join("root")
                            .join(inside),
                        driver,
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Every process's driver libraries (a full scan of `/proc`).
pub fn mapped_by_all() -> Vec<(PathBuf, Driver)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .flat_map(mapped_by)
        .collect()
}

/// Driver library paths (as the process sees them) in a `/proc/PID/maps` table, once each.
fn parse_maps(maps: &str) -> Vec<(PathBuf, Driver)> {
    let mut out: Vec<(PathBuf, Driver)> = Vec::new();
    for line in maps.lines() {
        // "addr perms offset dev inode   pathname"; the path may contain spaces.
        let Some(path) = line.splitn(6, char::is_whitespace).nth(5).map(str::trim) else {
            continue;
        };
        if !path.starts_with('/') || path.ends_with(" (deleted)") {
            continue;
        }
        let name = path.rsplit('/').next().unwrap_or(path);
        if let Some(driver) = Driver::of_file_name(name)
            && !out.iter().any(|(p, _)| p == Path::new(path))
        {
            out.push((PathBuf::from(path), driver));
        }
    }
    out
}

/// Driver libraries in the dynamic linker's cache (x86-64 entries only).
fn ldconfig_paths() -> Vec<(PathBuf, Driver)> {
    let output = ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"]
        .iter()
        .find_map(|cmd| Command::new(cmd).arg("-p").output().ok());
    output
        .map(|o| parse_ldconfig(&String::from_utf8_lossy(&o.stdout)))
        .unwrap_or_default()
}

/// Parses `ldconfig -p` lines like `\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/.../libcuda.so.1`.
fn parse_ldconfig(text: &str) -> Vec<(PathBuf, Driver)> {
    text.lines()
        .filter_map(|line| {
            let (left, path) = line.trim().split_once(" => ")?;
            let (name, arch) = left.split_once(' ')?;
            let driver = Driver::of_file_name(name)?;
            arch.contains("x86-64")
                .then(|| (PathBuf::from(path.trim()), driver))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldconfig_output() {
        let text = "3 libs found in cache `/etc/ld.so.cache'\n\
            \tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n\
            \tlibcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1\n\
            \tlibcudart.so.12 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.12\n";
        assert_eq!(
            parse_ldconfig(text),
            vec![(
                PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
                Driver::Cuda
            )]
        );
    }

    #[test]
    fn driver_libraries_in_maps() {
        let maps = "7f00-7f10 r--p 00000000 fd:01 123   /usr/lib/x86_64-linux-gnu/libc.so.6\n\
                    7f10-7f20 r-xp 00001000 fd:01 456   /opt/conda/lib/compat/libcuda.so.580.159\n\
                    7f20-7f30 r--p 00002000 fd:01 456   /opt/conda/lib/compat/libcuda.so.580.159\n\
                    7f30-7f40 r-xp 00000000 fd:01 789   /opt/rocm/lib/libamdhip64.so.6\n\
                    7f40-7f50 r-xp 00000000 fd:01 790   /tmp/old/libcuda.so.1 (deleted)\n\
                    7f50-7f60 rw-p 00000000 00:00 0     [heap]\n";
        assert_eq!(
            parse_maps(maps),
            vec![
                (
                    PathBuf::from("/opt/conda/lib/compat/libcuda.so.580.159"),
                    Driver::Cuda
                ),
                (PathBuf::from("/opt/rocm/lib/libamdhip64.so.6"), Driver::Hip),
            ]
        );
    }

    #[test]
    fn own_maps_resolve_through_proc_root() {
        // Our own process maps no driver; the function must still work and find nothing.
        assert!(mapped_by(std::process::id()).is_empty());
    }

    #[test]
    fn same_inode_through_two_paths_is_admitted_once() {
        let dir = std::env::temp_dir().join(format!("fgpu-dedup-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let real = dir.join("libcuda.so.1");
        std::fs::write(&real, b"not really a library").unwrap();
        let link = dir.join("libcuda.so");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let copy = dir.join("compat-libcuda.so.1");
        std::fs::copy(&real, &copy).unwrap();

        let mut d = Dedup::default();
        assert!(d.admit(&real, Driver::Cuda).is_some());
        assert!(
            d.admit(&link, Driver::Cuda).is_none(),
            "symlink to a seen inode"
        );
        assert!(
            d.admit(&copy, Driver::Cuda).is_some(),
            "a copy is a new inode"
        );
        assert!(d.admit(&dir.join("missing.so"), Driver::Cuda).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
