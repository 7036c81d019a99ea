//! Limits bound to the life of their cgroup: what the CDI hook registers for a container
//! (`fgpu cdi hook`). When the cgroup is removed (the container is gone), or replaced by a
//! new cgroup of the same path, its limit is removed from the limit store, so that no
//! container leaves a stale limit behind. The set is persisted beside the limits
//! (`bound.json`), so that an agent restarted after a container went away still cleans up.
//! The sweep that removes them is [`super::apply::sweep_bound`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

pub const FILE: &str = "bound.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    /// The cgroup's id (inode) when it was bound: a new cgroup of the same path is another.
    cgroup_id: u64,
}

#[derive(Debug)]
pub struct Bound {
    file: PathBuf,
    cgroups: BTreeMap<String, Entry>,
}

impl Bound {
    /// Opens the set in `state_dir` (the limit store has created the directory). A file that
    /// cannot be read is an error: its limits would otherwise never be cleaned up.
    pub fn open(state_dir: &Path) -> Result<Self> {
        let file = state_dir.join(FILE);
        let cgroups = match std::fs::read(&file) {
            Ok(bytes) => serde_json::from_slice(&bytes).with_context(|| {
                format!(
                    "{} is not a valid bound-limits file; fix or remove it",
                    file.display()
                )
            })?,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(err) => return Err(err).with_context(|| format!("reading {}", file.display())),
        };
        Ok(Self { file, cgroups })
    }

    /// Binds the limit of `cgroup` (id `cgroup_id`) to the cgroup's life. Persisted first.
    pub fn bind(&mut self, cgroup: &str, cgroup_id: u64) -> Result<()> {
        let mut next = self.cgroups.clone();
        next.insert(cgroup.to_string(), Entry { cgroup_id });
        self.commit(next)
    }

    #[cfg(test)]
    pub fn is_bound(&self, cgroup: &str) -> bool {
        self.cgroups.contains_key(cgroup)
    }

    /// Bound cgroups that no longer exist under `mount` (or exist as another cgroup).
    pub fn gone(&self, mount: &Path) -> Vec<String> {
        self.cgroups
            .iter()
            .filter(|(path, e)| super::cgroups::cgroup_id(mount, path) != Some(e.cgroup_id))
            .map(|(path, _)| path.clone())
            .collect()
    }

    pub fn forget(&mut self, cgroups: &[String]) -> Result<()> {
        let mut next = self.cgroups.clone();
        for c in cgroups {
            next.remove(c);
        }
        self.commit(next)
    }

    fn commit(&mut self, next: BTreeMap<String, Entry>) -> Result<()> {
        let tmp = self.file.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(&next)?;
        crate::statefile::write_atomic(&self.file, &tmp, &bytes, 0o600)
            .with_context(|| format!("saving {}", self.file.display()))?;
        self.cgroups = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_removed_or_recreated_cgroup_is_gone_and_the_set_survives_a_restart() {
        let root = std::env::temp_dir().join(format!("fgpu-bound-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let mount = root.join("cg");
        let state = root.join("state");
        std::fs::create_dir_all(mount.join("a")).unwrap();
        std::fs::create_dir_all(mount.join("b")).unwrap();
        std::fs::create_dir_all(&state).unwrap();
        let ino = |p: &str| std::fs::metadata(mount.join(p)).unwrap().ino();
        let mut b = Bound::open(&state).unwrap();
        b.bind("/a", ino("a")).unwrap();
        b.bind("/b", ino("b")).unwrap();
        assert!(b.gone(&mount).is_empty());
        drop(b);
        let mut b = Bound::open(&state).unwrap();
        assert!(b.is_bound("/a") && b.is_bound("/b"));
        std::fs::remove_dir(mount.join("a")).unwrap();
        // Same path, new directory (a new inode; keep the old one alive so it differs).
        let keep = mount.join("keep");
        std::fs::rename(mount.join("b"), &keep).unwrap();
        std::fs::create_dir(mount.join("b")).unwrap();
        assert_eq!(b.gone(&mount), ["/a", "/b"]);
        b.forget(&["/a".into(), "/b".into()]).unwrap();
        assert!(!Bound::open(&state).unwrap().is_bound("/a"));
        std::fs::write(state.join(FILE), b"nope").unwrap();
        assert!(Bound::open(&state).is_err());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
