//! The tenant a caller belongs to: what the connection caps of a door count it under.
//!
//! A tenant that may create sub-cgroups (a writable cgroupfs) can multiply anything keyed by
//! its leaf cgroup, so the key is a cgroup the tenant cannot make more of:
//! - its **structural tenant**: walking down from the root, the first cgroup that is not one
//!   of the node's shared parents (systemd slices `*.slice`, the cgroupfs parents `kubepods`,
//!   `burstable`, `besteffort`, `docker`, `libpod_parent`, `machine`, and `fgpu` under which
//!   `fgpu run` makes its jobs), a Kubernetes pod (either driver) or a container cgroup
//!   named by its runtime stopping the walk at once. Everything a tenant can create lies
//!   below that cgroup, because its own cgroup is at or below it (systemd delegates services
//!   and scopes, never slices; runtimes and the kubelet make the container and pod cgroups);
//! - unless the admin set a limit on a cgroup below that one, on the caller's way: then the
//!   nearest such limited cgroup (limits are the host's word, a tenant cannot create them).
//!
//! A caller whose cgroup cannot be read counts under its uid.

use super::cgroups::is_under;
use super::limits::{LimitView, ancestors};
use super::peer::Caller;
use super::state::State;

/// The key `caller`'s connections count under.
pub fn key(state: &State, caller: &Caller) -> String {
    match &caller.cgroup {
        Some(cg) => {
            let store = state.limits();
            tenant_of(&store, cg)
        }
        None => format!("uid:{}", caller.peer.uid),
    }
}

/// The tenant of a process in `cgroup` (see the module documentation).
pub fn tenant_of(store: &LimitView, cgroup: &str) -> String {
    let top = structural(cgroup);
    match ancestors(cgroup).find(|p| store.own(p).is_some()) {
        Some(limited) if is_under(limited, top) => limited.to_string(),
        _ => top.to_string(),
    }
}

/// The structural tenant of `cgroup`: a prefix of it (the whole path when every component
/// is a shared parent, e.g. a process in `/user.slice` itself or in the root).
fn structural(cgroup: &str) -> &str {
    let mut end = 0;
    for part in cgroup.split('/').filter(|p| !p.is_empty()) {
        let start = cgroup[end..].find(part).map_or(end, |i| end + i);
        end = start + part.len();
        let prefix = &cgroup[..end];
        if !fgpu_common::cgroup::shared::is_shared_parent(prefix) {
            return prefix;
        }
    }
    cgroup
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::limits::LimitStore;
    use crate::api::Limit;

    const UID: &str = "0f0e0d0c-0b0a-0908-0706-050403020100";

    fn cid() -> String {
        "ab".repeat(32)
    }

    fn store(limited: &[&str]) -> LimitStore {
        let d = std::env::temp_dir().join(format!(
            "fgpu-tenant-{}-{}",
            std::process::id(),
            limited.len()
        ));
        let _ = std::fs::remove_dir_all(&d);
        let mut s = LimitStore::open(&d).unwrap();
        for p in limited {
            let l = Limit {
                memory_bytes: Some(1 << 30),
                ..Limit::default()
            };
            s.set(p, &l).unwrap();
        }
        s
    }

    #[test]
    fn sub_cgroups_count_under_the_tenant_they_were_made_in() {
        let s = store(&[]);
        let c = cid();
        let docker = format!("/system.slice/docker-{c}.scope");
        for (cgroup, tenant) in [
            (format!("{docker}/a/b.slice/c"), docker.clone()),
            (docker.clone(), docker.clone()),
            (format!("/docker/{c}/x"), format!("/docker/{c}")),
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{c}.scope/evil",
                    UID.replace('-', "_")
                ),
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
                    UID.replace('-', "_")
                ),
            ),
            (
                format!("/kubepods/besteffort/pod{UID}/{c}/s1"),
                format!("/kubepods/besteffort/pod{UID}"),
            ),
            (
                format!("/kubepods/pod{UID}/{c}"),
                format!("/kubepods/pod{UID}"),
            ),
            ("/fgpu/job-1/sub".into(), "/fgpu/job-1".into()),
            (
                "/system.slice/sshd.service".into(),
                "/system.slice/sshd.service".into(),
            ),
            (
                "/user.slice/user-0.slice/session-3.scope/x".into(),
                "/user.slice/user-0.slice/session-3.scope".into(),
            ),
            ("/tenant-a/s1/s2".into(), "/tenant-a".into()),
            ("/user.slice".into(), "/user.slice".into()),
            ("/".into(), "/".into()),
        ] {
            assert_eq!(tenant_of(&s, &cgroup), tenant, "{cgroup}");
        }
    }

    #[test]
    fn a_limit_below_the_tenant_is_a_tenant_of_its_own_and_one_above_is_not() {
        let s = store(&["/tenant-a/limited", "/kubepods"]);
        assert_eq!(tenant_of(&s, "/tenant-a/limited/x"), "/tenant-a/limited");
        assert_eq!(tenant_of(&s, "/tenant-a/other"), "/tenant-a");
        assert_eq!(
            tenant_of(&s, &format!("/kubepods/pod{UID}/x")),
            format!("/kubepods/pod{UID}")
        );
    }
}
