//! The kubelet plugin (`fgpu kubelet-plugin`, `crate::k8s`), where a kubelet runs: the DRA
//! driver's registration socket `plugins_registry/<driver>-reg.sock` and its
//! `plugins/<driver>/dra.sock`, or the device-plugin fallback's sockets in `device-plugins/`,
//! each answered by a live server.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use super::{Check, Paths};
// The device plugin's socket for a resource, as the plugin names it.
use crate::k8s::deviceplugin::socket_name as device_plugin_socket;

const NAME: &str = "kubelet-plugin";

/// What is at a socket path.
#[derive(Debug, PartialEq, Eq)]
enum Sock {
    Absent,
    /// Present, and something accepts connections on it.
    Live,
    /// Present, but nothing serves it (a plugin that died, or was stopped uncleanly).
    Stale,
}

fn sock(path: &Path) -> Sock {
    if std::fs::symlink_metadata(path).is_err() {
        Sock::Absent
    } else if UnixStream::connect(path).is_ok() {
        Sock::Live
    } else {
        Sock::Stale
    }
}

pub fn check(p: &Paths) -> Check {
    let kubelet = &p.kubelet_dir;
    if !kubelet.is_dir() {
        return Check::skip(
            NAME,
            format!(
                "skipped: no kubelet on this node ({} does not exist)",
                kubelet.display()
            ),
        );
    }
    let driver = &p.driver_name;
    let dra: [PathBuf; 2] = [
        kubelet
            .join("plugins_registry")
            .join(format!("{driver}-reg.sock")),
        kubelet.join("plugins").join(driver).join("dra.sock"),
    ];
    let resources = [
        format!("{driver}/gpu-memory"),
        format!("{driver}/gpu-compute"),
    ];
    let device_plugin: Vec<PathBuf> = resources
        .iter()
        .map(|r| kubelet.join("device-plugins").join(device_plugin_socket(r)))
        .collect();
    let all: Vec<(&PathBuf, Sock)> = dra
        .iter()
        .chain(&device_plugin)
        .map(|s| (s, sock(s)))
        .collect();
    let stale: Vec<String> = all
        .iter()
        .filter(|(_, s)| *s == Sock::Stale)
        .map(|(path, _)| path.display().to_string())
        .collect();
    if !stale.is_empty() {
        return Check::fail(
            NAME,
            format!(
                "nothing serves {}: the kubelet plugin has stopped",
                stale.join(", ")
            ),
            "restart it (the Helm chart's DaemonSet: `kubectl -n NAMESPACE rollout restart \
             daemonset/fgpu`; else `fgpu kubelet-plugin`)",
        );
    }
    let live = |paths: &[PathBuf]| {
        all.iter()
            .filter(|(p, s)| paths.contains(p) && *s == Sock::Live)
            .count()
    };
    let (dra_live, dp_live) = (live(&dra), live(&device_plugin));
    match (dra_live, dp_live) {
        (2, _) | (_, 2) => {
            let mut served = Vec::new();
            if dra_live == 2 {
                served.push(format!("DRA driver {driver} ({})", dra[0].display()));
            }
            if dp_live == 2 {
                served.push(format!("device plugin {}", resources.join(", ")));
            }
            Check::ok(NAME, format!("registered: {}", served.join("; ")))
        }
        (0, 0) => Check::warn(
            NAME,
            format!(
                "a kubelet is here ({}) but fgpu's kubelet plugin is not registered (no {}, no \
                 device-plugin sockets)",
                kubelet.display(),
                dra[0].display()
            ),
            "install the Helm chart (deploy/helm/fgpu), or run `fgpu kubelet-plugin` \
             (`--device-plugin` for the device-plugin fallback)",
        ),
        _ => {
            let missing: Vec<String> = all
                .iter()
                .filter(|(_, s)| *s == Sock::Absent)
                .filter(|(path, _)| {
                    (dra_live > 0 && dra.contains(path))
                        || (dp_live > 0 && device_plugin.contains(path))
                })
                .map(|(path, _)| path.display().to_string())
                .collect();
            Check::fail(
                NAME,
                format!("half registered: {} missing", missing.join(", ")),
                "restart the kubelet plugin, which binds all its sockets at start",
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use super::super::Status;
    use super::super::tests::Tree;
    use super::*;

    #[test]
    fn no_kubelet_is_skipped() {
        let t = Tree::new("kubelet-none");
        let c = check(&t.paths());
        assert_eq!(c.status, Status::Skip);
        assert_eq!(
            c.detail,
            format!(
                "skipped: no kubelet on this node ({} does not exist)",
                t.0.join("var/lib/kubelet").display()
            )
        );
    }

    #[test]
    fn the_device_plugin_sockets_are_named_as_the_plugin_names_them() {
        assert_eq!(
            device_plugin_socket("fgpu.io/gpu-memory"),
            "fgpu-io-gpu-memory.sock"
        );
    }

    #[test]
    fn registered_unregistered_and_stale_plugins() {
        let t = Tree::new("kubelet");
        let p = t.paths();
        t.mkdir("/var/lib/kubelet/plugins_registry");
        t.mkdir("/var/lib/kubelet/plugins/fgpu.io");
        t.mkdir("/var/lib/kubelet/device-plugins");
        let none = check(&p);
        assert_eq!(none.status, Status::Warn);
        assert_eq!(
            none.fix.as_deref(),
            Some(
                "install the Helm chart (deploy/helm/fgpu), or run `fgpu kubelet-plugin` \
                 (`--device-plugin` for the device-plugin fallback)"
            )
        );

        let reg = p.kubelet_dir.join("plugins_registry/fgpu.io-reg.sock");
        let dra = p.kubelet_dir.join("plugins/fgpu.io/dra.sock");
        let reg_l = UnixListener::bind(&reg).unwrap();
        let half = check(&p);
        assert_eq!(half.status, Status::Fail);
        assert_eq!(
            half.detail,
            format!("half registered: {} missing", dra.display())
        );
        let _dra_l = UnixListener::bind(&dra).unwrap();
        let ok = check(&p);
        assert_eq!(ok.status, Status::Ok);
        assert_eq!(
            ok.detail,
            format!("registered: DRA driver fgpu.io ({})", reg.display())
        );

        drop(reg_l); // the socket file stays, nothing serves it
        let stale = check(&p);
        assert_eq!(stale.status, Status::Fail);
        assert_eq!(
            stale.detail,
            format!(
                "nothing serves {}: the kubelet plugin has stopped",
                reg.display()
            )
        );
        std::fs::remove_file(&reg).unwrap();
        std::fs::remove_file(&dra).unwrap();

        let dp = p.kubelet_dir.join("device-plugins");
        let _m = UnixListener::bind(dp.join("fgpu-io-gpu-memory.sock")).unwrap();
        let _c = UnixListener::bind(dp.join("fgpu-io-gpu-compute.sock")).unwrap();
        assert_eq!(
            check(&p).detail,
            "registered: device plugin fgpu.io/gpu-memory, fgpu.io/gpu-compute"
        );
    }
}
