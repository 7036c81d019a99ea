//! Finding the driver libraries to probe.
//!
//! Sources, in order: `--libcuda` paths given by the operator, the dynamic linker's cache
//! (`ldconfig -p`), and the directories NVIDIA's container toolkit and the distributions
//! install into. Every file is identified by (device, inode): the same library reached
//! through two paths (a symlink, a bind mount) is probed once.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

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
    pub fn admit(&mut self, path: &Path) -> Option<Library> {
        let meta = std::fs::metadata(path).ok()?;
        if !meta.is_file() {
            return None;
        }
        self.seen.insert((meta.dev(), meta.ino())).then(|| Library {
            path: path.to_path_buf(),
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }
}

/// Candidate paths of libcuda on this host (explicit ones first), not yet deduplicated.
pub fn system_candidates() -> Vec<PathBuf> {
    let mut out = ldconfig_paths(LIBCUDA);
    out.extend(LIB_DIRS.iter().map(|d| Path::new(d).join(LIBCUDA)));
    out
}

/// Paths the dynamic linker's cache knows for `soname` (x86-64 entries only).
fn ldconfig_paths(soname: &str) -> Vec<PathBuf> {
    let output = ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"]
        .iter()
        .find_map(|cmd| Command::new(cmd).arg("-p").output().ok());
    output
        .map(|o| parse_ldconfig(&String::from_utf8_lossy(&o.stdout), soname))
        .unwrap_or_default()
}

/// Parses `ldconfig -p` lines like `\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/.../libcuda.so.1`.
fn parse_ldconfig(text: &str, soname: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let (left, path) = line.trim().split_once(" => ")?;
            let (name, arch) = left.split_once(' ')?;
            (name == soname && arch.contains("x86-64")).then(|| PathBuf::from(path.trim()))
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
            parse_ldconfig(text, LIBCUDA),
            vec![PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so.1")]
        );
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
        assert!(d.admit(&real).is_some());
        assert!(d.admit(&link).is_none(), "symlink to a seen inode");
        assert!(d.admit(&copy).is_some(), "a copy is a new inode");
        assert!(d.admit(&dir.join("missing.so")).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
