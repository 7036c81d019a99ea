//! Naming cgroups: from the id the kernel reports (the inode of the cgroup's directory in
//! the v2 hierarchy) to the path people know.
//!
//! An id is resolved by itself, at a cost that does not grow with the number of cgroups on
//! the node: cgroup2 (kernfs) accepts its ids as file handles (`FILEID_KERNFS`), so
//! `open_by_handle_at` opens the directory and `/proc/self/fd` names it. A tenant that makes
//! tens of thousands of cgroups used to make every unknown id a walk of the whole hierarchy
//! (the agent's event thread spent seconds per batch of events). Where handles are refused
//! (no `CAP_DAC_READ_SEARCH`, an old kernel), a walk of the hierarchy is the fallback, at most
//! once per [`RESCAN_EVERY`]; ids still unknown after it stay unknown until the next one.
//! Removed cgroups are forgotten when the kernel says they went (`CgroupGone` records), so
//! the cache holds live cgroups only.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The id of cgroup `path` (the inode of its directory), if it exists.
pub fn cgroup_id(mount: &Path, path: &str) -> Option<u64> {
    std::fs::metadata(mount.join(path.trim_start_matches('/')))
        .ok()
        .map(|m| m.ino())
}

/// Whether cgroup path `path` is `ancestor` or lies below it.
pub fn is_under(path: &str, ancestor: &str) -> bool {
    ancestor == "/"
        || path == ancestor
        || path
            .strip_prefix(ancestor)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The most often the fallback walks the hierarchy.
pub const RESCAN_EVERY: Duration = Duration::from_secs(1);
/// `FILEID_KERNFS` (include/linux/exportfs.h): the handle type of kernfs (cgroup2) ids.
const FILEID_KERNFS: libc::c_int = 0xfe;
/// Names kept at most (live cgroups; an entry is 100 bytes or so).
const MAX_NAMES: usize = 1 << 20;

#[derive(Debug)]
pub struct CgroupNames {
    mount: PathBuf,
    paths: HashMap<u64, String>,
    /// The v2 mount's root directory, for `open_by_handle_at`; `None` if it cannot be opened.
    root: Option<OwnedFd>,
    /// Whether handles work here (cleared at the first EPERM / EOPNOTSUPP).
    handles: bool,
    last_rescan: Option<Instant>,
}

impl CgroupNames {
    pub fn new(mount: PathBuf) -> Self {
        let root = std::fs::File::open(&mount).ok().map(OwnedFd::from);
        Self {
            mount,
            paths: HashMap::new(),
            handles: root.is_some(),
            root,
            last_rescan: None,
        }
    }

    /// Path of cgroup `id` relative to the v2 root (`/` for the root itself). A cgroup
    /// removed since keeps its last known name until [`CgroupNames::forget`].
    pub fn path_of(&mut self, id: u64) -> Option<String> {
        if let Some(p) = self.paths.get(&id) {
            return Some(p.clone());
        }
        if let Some(p) = self.by_handle(id) {
            if self.paths.len() < MAX_NAMES {
                self.paths.insert(id, p.clone());
            }
            return Some(p);
        }
        if self.handles {
            return None; // the kernel says there is no such cgroup
        }
        if self.last_rescan.is_none_or(|t| t.elapsed() >= RESCAN_EVERY) {
            self.rescan();
        }
        self.paths.get(&id).cloned()
    }

    /// The kernel said cgroup `id` was removed.
    pub fn forget(&mut self, id: u64) {
        self.paths.remove(&id);
    }

    /// Opens cgroup `id` by its kernfs handle and names it; `None` if it does not exist (or
    /// handles do not work here, which clears `handles`).
    fn by_handle(&mut self, id: u64) -> Option<String> {
        if !self.handles {
            return None;
        }
        let root = self.root.as_ref()?;
        #[repr(C)]
        struct Handle {
            bytes: libc::c_uint,
            kind: libc::c_int,
            id: [u8; 8],
        }
        let mut handle = Handle {
            bytes: 8,
            kind: FILEID_KERNFS,
            id: id.to_ne_bytes(),
        };
        // SAFETY: `Handle` has the layout of `struct file_handle` followed by its 8 bytes of
        // `f_handle` (handle_bytes says 8); the kernel only reads it; `root` is an open fd.
        let fd = unsafe {
            libc::open_by_handle_at(
                root.as_raw_fd(),
                (&raw mut handle).cast(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let err = std::io::Error::last_os_error();
            match err.raw_os_error() {
                // No such cgroup (any more): ESTALE; a bad handle: EINVAL / ENOENT.
                Some(libc::ESTALE | libc::ENOENT | libc::EINVAL) => {}
                _ => {
                    tracing::info!(
                        "naming cgroups by handle does not work here ({err}): walking the \
                         hierarchy instead, at most once every {RESCAN_EVERY:?}"
                    );
                    self.handles = false;
                }
            }
            return None;
        }
        // SAFETY: open_by_handle_at just returned this new descriptor; nobody else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let target = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
        let rel = target.strip_prefix(&self.mount).ok()?;
        Some(format!("/{}", rel.display()))
    }

    fn rescan(&mut self) {
        self.last_rescan = Some(Instant::now());
        let mut stack = vec![self.mount.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(meta) = std::fs::metadata(&dir) else {
                continue; // removed while we walked
            };
            if self.paths.len() < MAX_NAMES {
                self.paths.insert(meta.ino(), relative(&self.mount, &dir));
            }
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            stack.extend(
                entries
                    .filter_map(Result::ok)
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
}

fn relative(mount: &Path, dir: &Path) -> String {
    let rel = dir.strip_prefix(mount).unwrap_or(dir);
    format!("/{}", rel.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_directories_by_inode_when_handles_do_not_apply() {
        // A plain directory tree (tmpfs or ext4): kernfs handles do not name these, so the
        // rate-limited walk does.
        let root = std::env::temp_dir().join(format!("fgpu-cgnames-{}", std::process::id()));
        let leaf = root.join("kubepods").join("pod1");
        std::fs::create_dir_all(&leaf).unwrap();
        let ino = std::fs::metadata(&leaf).unwrap().ino();
        let root_ino = std::fs::metadata(&root).unwrap().ino();
        let mut names = CgroupNames::new(root.clone());
        names.handles = false;
        assert_eq!(names.path_of(ino).as_deref(), Some("/kubepods/pod1"));
        assert_eq!(names.path_of(root_ino).as_deref(), Some("/"));
        let later = root.join("later");
        std::fs::create_dir_all(&later).unwrap();
        let later_ino = std::fs::metadata(&later).unwrap().ino();
        assert_eq!(
            names.path_of(later_ino),
            None,
            "no second walk within RESCAN_EVERY"
        );
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(
            names.path_of(ino).as_deref(),
            Some("/kubepods/pod1"),
            "kept after removal"
        );
        names.forget(ino);
        assert_eq!(
            names.path_of(ino),
            None,
            "forgotten once the kernel says it went"
        );
    }

    /// On the real cgroup2 hierarchy (root only): an id is named by its handle alone, a new
    /// cgroup at once, and a removed one is not named.
    #[test]
    fn names_real_cgroups_by_handle() {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let Some(mount) = fgpu_common::cgroup::cgroup2_mount(&mountinfo) else {
            return;
        };
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let dir = mount.join(format!("fgpu-cgnames-{}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap();
        let ino = std::fs::metadata(&dir).unwrap().ino();
        let mut names = CgroupNames::new(mount.clone());
        let expect = format!("/{}", dir.file_name().unwrap().to_string_lossy());
        assert_eq!(names.path_of(ino).as_deref(), Some(expect.as_str()));
        assert!(names.handles, "handles work on cgroup2 as root");
        assert!(names.last_rescan.is_none(), "no walk of the hierarchy");
        std::fs::remove_dir(&dir).unwrap();
        names.forget(ino);
        assert_eq!(names.path_of(ino), None);
        assert!(names.last_rescan.is_none(), "still no walk");
    }
}
