//! Naming cgroups: from the id the kernel reports (the inode of the cgroup's directory in
//! the v2 hierarchy) to the path people know.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub struct CgroupNames {
    mount: PathBuf,
    paths: HashMap<u64, String>,
}

impl CgroupNames {
    pub fn new(mount: PathBuf) -> Self {
        Self {
            mount,
            paths: HashMap::new(),
        }
    }

    /// Path of cgroup `id` relative to the v2 root (`/` for the root itself). Unknown ids
    /// trigger one walk of the hierarchy; a cgroup removed since keeps its last known name.
    pub fn path_of(&mut self, id: u64) -> Option<String> {
        if !self.paths.contains_key(&id) {
            self.rescan();
        }
        self.paths.get(&id).cloned()
    }

    fn rescan(&mut self) {
        let mut stack = vec![self.mount.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(meta) = std::fs::metadata(&dir) else {
                continue; // removed while we walked
            };
            self.paths.insert(meta.ino(), relative(&self.mount, &dir));
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
    fn names_directories_by_inode() {
        let root = std::env::temp_dir().join(format!("fgpu-cgnames-{}", std::process::id()));
        let leaf = root.join("kubepods").join("pod1");
        std::fs::create_dir_all(&leaf).unwrap();
        let ino = std::fs::metadata(&leaf).unwrap().ino();
        let root_ino = std::fs::metadata(&root).unwrap().ino();
        let mut names = CgroupNames::new(root.clone());
        assert_eq!(names.path_of(ino).as_deref(), Some("/kubepods/pod1"));
        assert_eq!(names.path_of(root_ino).as_deref(), Some("/"));
        assert_eq!(names.path_of(u64::MAX), None);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(
            names.path_of(ino).as_deref(),
            Some("/kubepods/pod1"),
            "kept after removal"
        );
    }
}
