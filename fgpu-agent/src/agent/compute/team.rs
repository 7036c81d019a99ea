//! Compute teams: a cgroup's share split among the ledgers below it (docs/compute.md,
//! "Teams").
//!
//! A share set on a cgroup that is not itself a ledger's — a pod's share over its
//! containers, a team's over its jobs — is the share of all of them together, split among
//! those using the device by their own shares (equally when they set none). One level of
//! nesting counts: a ledger's *team* is the nearest cgroup above the nearest one that sets
//! its share; shares further up do not split it again.
//!
//! The split itself is the scheduler's ([`super::sched`]): it knows which members use the
//! device at each tick, so a member that is idle leaves its part to the others at once.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use fgpu_common::ledger::uuid_key;

use super::sched::Team;
use crate::agent::gpus::uuid_bytes;
use crate::agent::limits::{LimitView, ancestors};
use crate::api::Limit;

/// A share as a limit states it: per GPU (by device key) and plain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Share {
    per_key: Vec<(u64, u8)>,
    plain: Option<u8>,
}

impl Share {
    fn of(l: &Limit) -> Share {
        Share {
            per_key: l
                .compute_gpus
                .iter()
                .filter_map(|(u, p)| Some((uuid_key(&uuid_bytes(u)?), *p)))
                .collect(),
            plain: l.compute_pct,
        }
    }

    fn on(&self, key: u64) -> Option<u8> {
        self.per_key
            .iter()
            .find(|(k, _)| key != 0 && *k == key)
            .map(|(_, p)| *p)
            .or(self.plain)
    }

    fn any(&self) -> bool {
        self.plain.is_some() || !self.per_key.is_empty()
    }
}

/// The team of one ledger's cgroup: whose share it is part of, and its own weight in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeamSpec {
    /// The cgroup whose share is split (for status and logs).
    pub owner: String,
    id: u64,
    share: Share,
    /// The member's own weight (a share set at or below the team's cgroup); none: 100.
    weight: Option<Share>,
}

impl TeamSpec {
    /// The team of the ledger of `cgroup` under the limits of `store`, if its share comes
    /// from above it.
    pub fn of(store: &LimitView, cgroup: &str) -> Option<TeamSpec> {
        let mut setters = ancestors(cgroup).filter_map(|p| {
            let s = Share::of(store.own(p)?);
            s.any().then_some((p, s))
        });
        let (first, first_share) = setters.next()?;
        let ((owner, share), weight) = if first == cgroup {
            (setters.next()?, Some(first_share))
        } else {
            ((first, first_share), None)
        };
        let mut h = DefaultHasher::new();
        owner.hash(&mut h);
        Some(TeamSpec {
            owner: owner.to_string(),
            // Never 0 (the scheduler's "no team").
            id: h.finish() | 1,
            share,
            weight,
        })
    }

    /// The team on the device of key `key`: none where the team's cgroup sets no share
    /// there (the member's own share, if any, then stands alone).
    pub fn on(&self, key: u64) -> Option<Team> {
        let share = self.share.on(key)?;
        let weight = self.weight.as_ref().and_then(|w| w.on(key)).unwrap_or(100);
        Some(Team {
            id: self.id,
            share: u32::from(share),
            weight: u32::from(weight).max(1),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::limits::LimitStore;

    struct Dir(std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn store(limits: &[(&str, Limit)]) -> (Dir, LimitStore) {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("fgpu-team-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let mut s = LimitStore::open(&d).unwrap();
        for (cg, l) in limits {
            s.set(cg, l).unwrap();
        }
        (Dir(d), s)
    }

    fn share(p: u8) -> Limit {
        Limit {
            compute_pct: Some(p),
            ..Limit::default()
        }
    }

    #[test]
    fn a_share_set_above_the_ledger_makes_a_team_of_equal_members() {
        let (_d, s) = store(&[("/pod", share(50))]);
        let t = TeamSpec::of(&s, "/pod/c1").expect("a team");
        assert_eq!(t.owner, "/pod");
        let on = t.on(7).unwrap();
        assert_eq!((on.share, on.weight), (50, 100));
        assert_eq!(
            TeamSpec::of(&s, "/pod/c2").unwrap().on(7).unwrap().id,
            on.id
        );
        // The pod's own ledger (a memory limit there) is no team member: its share is its own.
        assert_eq!(TeamSpec::of(&s, "/pod"), None);
        assert_eq!(TeamSpec::of(&s, "/other"), None);
    }

    #[test]
    fn a_member_with_its_own_share_weighs_by_it_and_only_one_level_counts() {
        let (_d, s) = store(&[
            ("/ns", share(80)),
            ("/ns/pod", share(60)),
            ("/ns/pod/c1", share(30)),
        ]);
        let on = TeamSpec::of(&s, "/ns/pod/c1").unwrap().on(1).unwrap();
        assert_eq!((on.share, on.weight), (60, 30));
        let t2 = TeamSpec::of(&s, "/ns/pod/c2").unwrap();
        assert_eq!(t2.owner, "/ns/pod");
        assert_eq!(t2.on(1).unwrap().weight, 100);
    }

    #[test]
    fn a_member_alone_with_its_share_has_no_team() {
        let (_d, s) = store(&[("/pod/c1", share(30))]);
        assert_eq!(TeamSpec::of(&s, "/pod/c1"), None);
        // Memory-only limits above do not make a team.
        let (_d, s) = store(&[
            (
                "/pod",
                Limit {
                    memory_bytes: Some(1 << 30),
                    ..Limit::default()
                },
            ),
            ("/pod/c1", share(30)),
        ]);
        assert_eq!(TeamSpec::of(&s, "/pod/c1"), None);
    }
}
