//! Limits per cgroup, persisted in the state directory.
//!
//! A memory limit on a cgroup covers all processes of all its descendants together (the
//! kernel checks every limited ancestor of an allocating cgroup; the shims' budgets are
//! chosen in [`super::budget`]); a descendant may have a lower limit of its own, and the
//! lowest on the way to the root is the one that applies. Memory limits are per GPU: a
//! cgroup's plain value (`memory_bytes`) applies on every GPU, its per-GPU values
//! (`memory_gpus`, by UUID) replace it on their GPUs, and on each GPU the lowest value of the
//! cgroup and its ancestors applies. Compute settings are inherited
//! field by field from the nearest cgroup that sets them. The file is rewritten atomically (temporary file, fsync, rename) on every change,
//! and a change that cannot be persisted is not applied.
//!
//! Beside a limit on a pod's cgroup the store keeps the pod's namespace and name, as the
//! kubelet plugin gave them (in `pods.json`): the status report names pods by them, and they
//! go with the limit.
//!
//! What readers need of the store is a [`LimitView`]: a locked store derefs to its own, and
//! a pass that reads the limits throughout takes a copy ([`LimitStore::view`]) instead of
//! holding the store's lock.

use std::collections::BTreeMap;
use std::ops::Deref;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::ValueEnum;

use super::gpus::Gpu;
use crate::api::{Limit, PodName};

pub const FILE: &str = "limits.json";
/// The pods' names, by the cgroup whose limit they go with.
pub const PODS_FILE: &str = "pods.json";

#[derive(Debug)]
pub struct LimitStore {
    file: PathBuf,
    held: LimitView,
}

/// The limits and the pods' names as a store holds them, read-only: a store's own (a
/// `&LimitStore` derefs to it) or a copy ([`LimitStore::view`]).
#[derive(Debug, Clone, Default)]
pub struct LimitView {
    limits: BTreeMap<String, Limit>,
    pods: BTreeMap<String, PodName>,
}

impl Deref for LimitStore {
    type Target = LimitView;

    fn deref(&self) -> &LimitView {
        &self.held
    }
}

impl LimitStore {
    /// Opens (creating if needed) the store in `state_dir`. A file that cannot be read is an
    /// error, not an empty store: starting without the operator's limits would lift them.
    pub fn open(state_dir: &Path) -> Result<Self> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(state_dir)
            .with_context(|| format!("creating the state directory {}", state_dir.display()))?;
        let file = state_dir.join(FILE);
        let limits = match std::fs::read(&file) {
            Ok(bytes) => serde_json::from_slice(&bytes).with_context(|| {
                format!(
                    "{} is not a valid limits file; fix or move it away (limits it holds \
                     would otherwise be lost)",
                    file.display()
                )
            })?,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(err) => {
                return Err(err).with_context(|| format!("reading {}", file.display()));
            }
        };
        // Names only label the status: a file that cannot be read is left out (the kubelet
        // plugin sends them again with the limits it reasserts).
        let pods_file = state_dir.join(PODS_FILE);
        let pods = match std::fs::read(&pods_file) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|err| {
                tracing::warn!(file = %pods_file.display(), "pods' names not read: {err}");
                BTreeMap::new()
            }),
            Err(_) => BTreeMap::new(),
        };
        Ok(Self {
            file,
            held: LimitView { limits, pods },
        })
    }

    /// A copy of the limits and the pods' names, to read without the store's lock.
    pub fn view(&self) -> LimitView {
        self.held.clone()
    }

    /// Keeps `pod` as the name of the pod whose cgroup `cgroup` is, while `cgroup` has a
    /// limit of its own (none kept otherwise).
    pub fn set_pod(&mut self, cgroup: &str, pod: &PodName) -> Result<()> {
        if !self.held.limits.contains_key(cgroup) || self.held.pods.get(cgroup) == Some(pod) {
            return Ok(());
        }
        let mut next = self.held.pods.clone();
        next.insert(cgroup.to_string(), pod.clone());
        self.commit_pods(next)
    }

    /// Sets the given fields of `cgroup`'s limit (others keep their value). Persisted before
    /// it takes effect; returns the cgroup's new own limit.
    pub fn set(&mut self, cgroup: &str, update: &Limit) -> Result<Limit> {
        let mut next = self.held.limits.clone();
        let entry = next.entry(cgroup.to_string()).or_default();
        entry.memory_bytes = update.memory_bytes.or(entry.memory_bytes);
        entry.compute_pct = update.compute_pct.or(entry.compute_pct);
        entry.compute_cap_pct = update.compute_cap_pct.or(entry.compute_cap_pct);
        entry.compute_priority = update.compute_priority.or(entry.compute_priority);
        entry.park_after_ms = update.park_after_ms.or(entry.park_after_ms);
        entry.memory_gpus.extend(update.memory_gpus.clone());
        entry.compute_gpus.extend(update.compute_gpus.clone());
        entry
            .compute_cap_gpus
            .extend(update.compute_cap_gpus.clone());
        let result = entry.clone();
        self.commit(next)?;
        Ok(result)
    }

    /// Removes the per-GPU values (memory, compute share and ceiling) of `uuids` from
    /// `cgroup`'s own limit (a limit left with nothing set is removed). Returns the new own
    /// limit, or `None` if the cgroup had none of those values (nothing is changed then).
    pub fn clear_gpus(&mut self, cgroup: &str, uuids: &[String]) -> Result<Option<Limit>> {
        let mut next = self.held.limits.clone();
        let Some(entry) = next.get_mut(cgroup) else {
            return Ok(None);
        };
        if !uuids.iter().any(|u| entry.names_gpu(u)) {
            return Ok(None);
        }
        entry.memory_gpus.retain(|u, _| !uuids.contains(u));
        entry.compute_gpus.retain(|u, _| !uuids.contains(u));
        entry.compute_cap_gpus.retain(|u, _| !uuids.contains(u));
        let result = entry.clone();
        if result == Limit::default() {
            next.remove(cgroup);
        }
        self.commit(next)?;
        Ok(Some(result))
    }

    /// Removes `cgroup`'s own limit (and the pod name kept with it); returns it, or `None`
    /// if it had none.
    pub fn remove(&mut self, cgroup: &str) -> Result<Option<Limit>> {
        let mut next = self.held.limits.clone();
        let removed = next.remove(cgroup);
        if removed.is_some() {
            self.commit(next)?;
        }
        Ok(removed)
    }

    /// Writes `next`; then forgets the pod names of cgroups left without a limit (a failure
    /// to write those is only said: the names are labels).
    fn commit(&mut self, next: BTreeMap<String, Limit>) -> Result<()> {
        let tmp = self.file.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(&next)?;
        crate::statefile::write_atomic(&self.file, &tmp, &bytes, 0o600)
            .with_context(|| format!("saving limits to {}", self.file.display()))?;
        self.held.limits = next;
        if self
            .held
            .pods
            .keys()
            .any(|cg| !self.held.limits.contains_key(cg))
        {
            let mut pods = self.held.pods.clone();
            pods.retain(|cg, _| self.held.limits.contains_key(cg));
            if let Err(err) = self.commit_pods(pods) {
                tracing::warn!("{err:#}");
            }
        }
        Ok(())
    }

    fn commit_pods(&mut self, next: BTreeMap<String, PodName>) -> Result<()> {
        let file = self.file.with_file_name(PODS_FILE);
        let tmp = file.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(&next)?;
        crate::statefile::write_atomic(&file, &tmp, &bytes, 0o600)
            .with_context(|| format!("saving the pods' names to {}", file.display()))?;
        self.held.pods = next;
        Ok(())
    }
}

impl LimitView {
    /// The name of the pod whose own cgroup `cgroup` is, as given with its limit.
    pub fn pod(&self, cgroup: &str) -> Option<&PodName> {
        self.pods.get(cgroup)
    }

    /// The limit set on exactly this cgroup.
    pub fn own(&self, cgroup: &str) -> Option<&Limit> {
        self.limits.get(cgroup)
    }

    /// Every explicitly set limit, by cgroup path.
    pub fn all(&self) -> impl Iterator<Item = (&String, &Limit)> {
        self.limits.iter()
    }

    /// The limit that applies to `cgroup`: the lowest memory limit of the cgroup and its
    /// ancestors (the nearest on a tie), per GPU as well (for every GPU that one of them
    /// names, the lowest of their values there, a plain value counting on every GPU), and
    /// compute fields from the nearest that sets them. Returns the limit and the cgroup
    /// whose plain memory limit it is.
    pub fn effective(&self, cgroup: &str) -> (Limit, Option<String>) {
        let mut out = Limit::default();
        let mut memory_from = None;
        let chain: Vec<&Limit> = ancestors(cgroup)
            .filter_map(|p| self.limits.get(p))
            .collect();
        for path in ancestors(cgroup) {
            let Some(l) = self.limits.get(path) else {
                continue;
            };
            if let Some(m) = l.memory_bytes
                && out.memory_bytes.is_none_or(|cur| m < cur)
            {
                out.memory_bytes = Some(m);
                memory_from = Some(path.to_string());
            }
            out.compute_pct = out.compute_pct.or(l.compute_pct);
            out.compute_cap_pct = out.compute_cap_pct.or(l.compute_cap_pct);
            out.compute_priority = out.compute_priority.or(l.compute_priority);
            out.park_after_ms = out.park_after_ms.or(l.park_after_ms);
        }
        for uuid in chain.iter().flat_map(|l| l.memory_gpus.keys()) {
            if let Some(m) = chain.iter().filter_map(|l| l.memory_on(uuid)).min() {
                out.memory_gpus.insert(uuid.clone(), m);
            }
        }
        // Compute per GPU: from the nearest cgroup with a value there (per-GPU or plain).
        type PerGpu = fn(&Limit) -> &BTreeMap<String, u8>;
        let nearest = |per: PerGpu, on: fn(&Limit, &str) -> Option<u8>| {
            chain
                .iter()
                .flat_map(|l| per(l).keys())
                .filter_map(|u| Some((u.clone(), chain.iter().find_map(|l| on(l, u))?)))
                .collect::<BTreeMap<_, _>>()
        };
        out.compute_gpus = nearest(|l| &l.compute_gpus, Limit::compute_on);
        out.compute_cap_gpus = nearest(|l| &l.compute_cap_gpus, Limit::compute_cap_on);
        (out, memory_from)
    }
}

/// `/a/b/c`, `/a/b`, `/a`, `/`.
pub fn ancestors(cgroup: &str) -> impl Iterator<Item = &str> {
    let mut next = Some(cgroup);
    std::iter::from_fn(move || {
        let cur = next?;
        next = match cur.rfind('/') {
            Some(0) if cur.len() > 1 => Some("/"),
            Some(0) | None => None,
            Some(i) => Some(&cur[..i]),
        };
        Some(cur)
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnExceed {
    /// Kill the process whose allocation crossed the limit (in the kernel, at once).
    Kill,
    /// Only report it; the shims in the cgroup refuse further allocations.
    Deny,
}

/// A limited cgroup's threshold in the kernel (see [`super::enforce`]): the sum of
/// its limits over the node's GPUs (a per-GPU value where it has one, else its plain
/// limit); no bound in the kernel (`u64::MAX`, the entry still makes it a tenant) where a
/// GPU of the node has no limit of it. `None`: no memory limit. Without a GPU list (no
/// NVML) the plain limit counts once.
pub fn threshold(gpus: &[Gpu], limit: &Limit) -> Option<u64> {
    if !limit.has_memory() {
        return None;
    }
    if gpus.is_empty() {
        return limit.memory_bytes;
    }
    Some(
        gpus.iter()
            .try_fold(0u64, |sum, g| {
                limit.memory_on(&g.uuid).map(|b| sum.saturating_add(b))
            })
            .unwrap_or(u64::MAX),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("fgpu-limits-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn mem(bytes: u64) -> Limit {
        Limit {
            memory_bytes: Some(bytes),
            ..Limit::default()
        }
    }

    #[test]
    fn ancestors_walk_to_the_root() {
        assert_eq!(
            ancestors("/a/b/c").collect::<Vec<_>>(),
            ["/a/b/c", "/a/b", "/a", "/"]
        );
        assert_eq!(ancestors("/").collect::<Vec<_>>(), ["/"]);
    }

    #[test]
    fn survives_a_restart_and_children_inherit_field_by_field() {
        let d = dir();
        let mut s = LimitStore::open(&d).unwrap();
        s.set("/team", &mem(2 << 30)).unwrap();
        s.set(
            "/team/job",
            &Limit {
                compute_pct: Some(30),
                ..Limit::default()
            },
        )
        .unwrap();
        drop(s);

        let s = LimitStore::open(&d).unwrap();
        let (eff, from) = s.effective("/team/job/worker");
        assert_eq!(eff.memory_bytes, Some(2 << 30));
        assert_eq!(eff.compute_pct, Some(30));
        assert_eq!(from.as_deref(), Some("/team"));
        assert_eq!(s.effective("/other").0, Limit::default());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_lowest_memory_limit_on_the_way_up_applies() {
        let d = dir();
        let mut s = LimitStore::open(&d).unwrap();
        s.set("/pod", &mem(8 << 30)).unwrap();
        s.set("/pod/small", &mem(2 << 30)).unwrap();
        s.set("/pod/big", &mem(16 << 30)).unwrap();
        let (eff, from) = s.effective("/pod/small/x");
        assert_eq!(
            (eff.memory_bytes, from.as_deref()),
            (Some(2 << 30), Some("/pod/small"))
        );
        let (eff, from) = s.effective("/pod/big");
        assert_eq!(
            (eff.memory_bytes, from.as_deref()),
            (Some(8 << 30), Some("/pod"))
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn set_merges_and_remove_forgets() {
        let d = dir();
        let mut s = LimitStore::open(&d).unwrap();
        s.set("/a", &mem(1 << 30)).unwrap();
        let merged = s
            .set(
                "/a",
                &Limit {
                    compute_cap_pct: Some(50),
                    ..Limit::default()
                },
            )
            .unwrap();
        assert_eq!(merged.memory_bytes, Some(1 << 30));
        assert_eq!(merged.compute_cap_pct, Some(50));
        assert!(s.remove("/a").unwrap().is_some());
        assert!(s.remove("/a").unwrap().is_none());
        assert!(LimitStore::open(&d).unwrap().own("/a").is_none());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn per_gpu_compute_comes_from_the_nearest_cgroup_with_a_value_there() {
        let d = dir();
        let mut s = LimitStore::open(&d).unwrap();
        let share_on = |uuid: &str, p: u8| Limit {
            compute_gpus: BTreeMap::from([(uuid.to_string(), p)]),
            ..Limit::default()
        };
        s.set(
            "/pod",
            &Limit {
                compute_pct: Some(50),
                compute_cap_gpus: BTreeMap::from([("GPU-1".to_string(), 40)]),
                ..Limit::default()
            },
        )
        .unwrap();
        s.set("/pod/job", &share_on("GPU-1", 30)).unwrap();
        let (eff, _) = s.effective("/pod/job/x");
        assert_eq!(
            eff.compute_pct,
            Some(50),
            "the parent's plain share elsewhere"
        );
        assert_eq!(eff.compute_gpus, BTreeMap::from([("GPU-1".into(), 30)]));
        assert_eq!(eff.compute_on("GPU-0"), Some(50));
        assert_eq!(
            eff.compute_cap_on("GPU-1"),
            Some(40),
            "the parent's cap on GPU 1"
        );
        // A nearer plain value wins over an ancestor's per-GPU one.
        s.set(
            "/pod/job/x",
            &Limit {
                compute_pct: Some(60),
                ..Limit::default()
            },
        )
        .unwrap();
        let (eff, _) = s.effective("/pod/job/x");
        assert_eq!(eff.compute_on("GPU-1"), Some(60));
        // Clearing GPU 1 on the job takes its per-GPU share away, nothing else.
        let left = s.clear_gpus("/pod/job", &["GPU-1".into()]).unwrap();
        assert_eq!(left, Some(Limit::default()));
        assert!(
            s.own("/pod/job").is_none(),
            "nothing else was set: the job's limit is gone"
        );
        assert!(
            s.clear_gpus("/pod/job", &["GPU-1".into()])
                .unwrap()
                .is_none()
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn on_gpu(uuid: &str, bytes: u64) -> Limit {
        Limit {
            memory_gpus: BTreeMap::from([(uuid.to_string(), bytes)]),
            ..Limit::default()
        }
    }

    #[test]
    fn per_gpu_values_merge_inherit_as_the_lowest_and_clear_one_by_one() {
        let d = dir();
        let mut s = LimitStore::open(&d).unwrap();
        s.set("/pod", &mem(4 << 30)).unwrap();
        s.set("/pod/job", &on_gpu("GPU-0", 8 << 30)).unwrap();
        let merged = s.set("/pod/job", &on_gpu("GPU-1", 1 << 30)).unwrap();
        assert_eq!(
            merged.memory_gpus,
            BTreeMap::from([("GPU-0".into(), 8 << 30), ("GPU-1".into(), 1 << 30)]),
            "setting GPU 1 keeps GPU 0's value"
        );
        // GPU-0: min(own 8, parent's plain 4); GPU-1: min(1, 4); other GPUs: the parent's 4.
        let (eff, from) = s.effective("/pod/job/x");
        assert_eq!(
            eff.memory_gpus,
            BTreeMap::from([("GPU-0".into(), 4 << 30), ("GPU-1".into(), 1 << 30)])
        );
        assert_eq!(
            (eff.memory_bytes, from.as_deref()),
            (Some(4 << 30), Some("/pod"))
        );
        assert_eq!(eff.memory_on("GPU-7"), Some(4 << 30));
        // A per-GPU value replaces the same cgroup's plain value on its GPU.
        s.set("/solo", &mem(2 << 30)).unwrap();
        s.set("/solo", &on_gpu("GPU-1", 6 << 30)).unwrap();
        let eff = s.effective("/solo").0;
        assert_eq!(
            (eff.memory_on("GPU-1"), eff.memory_on("GPU-0")),
            (Some(6 << 30), Some(2 << 30))
        );
        drop(s);

        let mut s = LimitStore::open(&d).unwrap();
        assert_eq!(
            s.own("/pod/job").unwrap().memory_gpus.len(),
            2,
            "survives a restart"
        );
        assert!(
            s.clear_gpus("/pod/job", &["GPU-9".into()])
                .unwrap()
                .is_none()
        );
        let left = s
            .clear_gpus("/pod/job", &["GPU-1".into()])
            .unwrap()
            .unwrap();
        assert_eq!(
            left.memory_gpus,
            BTreeMap::from([("GPU-0".into(), 8 << 30)])
        );
        assert!(
            s.clear_gpus("/pod/job", &["GPU-0".into()])
                .unwrap()
                .is_some()
        );
        assert!(s.own("/pod/job").is_none(), "a limit left empty is removed");
        assert!(LimitStore::open(&d).unwrap().own("/pod/job").is_none());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_pods_name_goes_with_its_limit() {
        let d = dir();
        let name = PodName {
            namespace: "team-a".into(),
            name: "pod-a".into(),
        };
        let mut s = LimitStore::open(&d).unwrap();
        s.set_pod("/kubepods/pod1", &name).unwrap();
        assert_eq!(s.pod("/kubepods/pod1"), None, "no limit, no name kept");
        s.set("/kubepods/pod1", &mem(1 << 30)).unwrap();
        s.set("/kubepods/pod2", &mem(1 << 30)).unwrap();
        s.set_pod("/kubepods/pod1", &name).unwrap();
        s.set_pod("/kubepods/pod2", &name).unwrap();
        drop(s);
        let mut s = LimitStore::open(&d).unwrap();
        assert_eq!(s.pod("/kubepods/pod1"), Some(&name), "survives a restart");
        s.remove("/kubepods/pod1").unwrap();
        assert_eq!(s.pod("/kubepods/pod1"), None, "gone with the limit");
        s.set("/kubepods/pod2", &on_gpu("GPU-0", 1)).unwrap();
        s.remove("/kubepods/pod2").unwrap();
        assert_eq!(s.pod("/kubepods/pod2"), None);
        assert_eq!(LimitStore::open(&d).unwrap().pod("/kubepods/pod2"), None);
        // A names file that cannot be read leaves the names out, never the limits.
        s.set("/kubepods/pod3", &mem(1 << 30)).unwrap();
        std::fs::write(d.join(PODS_FILE), b"{not json").unwrap();
        let s = LimitStore::open(&d).unwrap();
        assert_eq!(s.pod("/kubepods/pod3"), None);
        assert!(s.own("/kubepods/pod3").is_some());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_state_file_without_per_gpu_values_still_loads() {
        let d = dir();
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join(FILE),
            br#"{"/a":{"memory_bytes":1073741824,"compute_pct":null,"compute_cap_pct":null}}"#,
        )
        .unwrap();
        let s = LimitStore::open(&d).unwrap();
        assert_eq!(s.own("/a").unwrap(), &mem(1 << 30));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_corrupt_file_is_an_error_not_an_empty_store() {
        let d = dir();
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(FILE), b"{ not json").unwrap();
        let err = LimitStore::open(&d).unwrap_err().to_string();
        assert!(err.contains("not a valid limits file"), "{err}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
