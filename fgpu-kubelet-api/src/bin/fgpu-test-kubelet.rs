//! `fgpu-test-kubelet`: the kubelet's side of the plugin-registration and DRA APIs, as a
//! command, for checking a DRA plugin on a machine without a kubelet (tests/gpu/k8s_prepare.sh).
//! Prints the plugin's answers as JSON lines.
//!
//!   fgpu-test-kubelet register REG_SOCK
//!   fgpu-test-kubelet prepare DRA_SOCK NAMESPACE/NAME/UID...
//!   fgpu-test-kubelet unprepare DRA_SOCK NAMESPACE/NAME/UID...
//!   fgpu-test-kubelet start-pod STATE DRA_SOCK POD_UID NAMESPACE/NAME/UID...
//!   fgpu-test-kubelet stop-pod STATE DRA_SOCK POD_UID
//!   fgpu-test-kubelet restart [--device-plugins-dir DIR] [--registry-dir DIR]
//!                             [--api-server URL --node NAME]
//!
//! `register` is the plugin watcher's registration of one plugin (GetInfo, the DRA handler's
//! check of its services, NotifyRegistrationStatus: `fgpu_kubelet_api::stand_in::plugin_watcher`);
//! a refused plugin is told why and the command exits 1.
//!
//! `restart` is what a kubelet that starts does to the plugins already running
//! (`fgpu_kubelet_api::stand_in::restart`, shared with the end-to-end tests), for the parts
//! given: the device manager removes the sockets of the device-plugins directory but keeps
//! its checkpoint (pkg/kubelet/cm/devicemanager/manager.go, `CleanupPluginDirectory`); the DRA
//! plugin manager deletes the node's ResourceSlices, every driver's, with one DeleteCollection
//! by field selector `spec.nodeName=NAME` (pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go,
//! `wipeResourceSlices`; plain http only, e.g. a `kubectl proxy`; retried 5 times, 1 s, 2 s,
//! ... apart); the plugin watcher registers every socket found in the registry directory again
//! (pkg/kubelet/pluginmanager/pluginwatcher/plugin_watcher.go; names starting with '.'
//! skipped). One JSON line per removed socket (`removed`), for the wipe (`deleted_slices`),
//! per registration (as `register`'s) and per failed step (`failed`, `error`); exit 1 if
//! anything failed. It does not serve a new kubelet.sock, so device plugins wait to register.
//!
//! `prepare` and `unprepare` are the bare calls. `start-pod` and `stop-pod` act as the
//! kubelet's DRA manager does for a pod (pkg/kubelet/cm/dra/manager.go, shared with the
//! end-to-end tests: `fgpu_kubelet_api::stand_in::dra_manager`): a claim already prepared on
//! the node is not prepared again, a failed prepare fails the pod (exit 1, upstream's
//! message), and only the last pod's stop unprepares a claim. STATE is the manager's claim
//! cache, kept between commands as the kubelet checkpoints it; it prints the calls it made.

use std::path::Path;

use fgpu_kubelet_api::stand_in::dra_manager::DraManager;
use fgpu_kubelet_api::stand_in::plugin_watcher;
use fgpu_kubelet_api::stand_in::restart::Restart;

use fgpu_kubelet_api::dra::v1 as dra;

type Error = Box<dyn std::error::Error>;

const USAGE: &str = "usage: fgpu-test-kubelet register REG_SOCK | prepare DRA_SOCK NS/NAME/UID... | unprepare DRA_SOCK NS/NAME/UID... | start-pod STATE DRA_SOCK POD_UID NS/NAME/UID... | stop-pod STATE DRA_SOCK POD_UID | restart [--device-plugins-dir DIR] [--registry-dir DIR] [--api-server URL --node NAME]";

async fn channel(path: &Path) -> Result<tonic::transport::Channel, Error> {
    Ok(fgpu_kubelet_api::stand_in::channel(path).await?)
}

fn claims(args: &[String]) -> Result<Vec<dra::Claim>, Error> {
    args.iter()
        .map(|a| {
            let mut it = a.splitn(3, '/');
            match (it.next(), it.next(), it.next()) {
                (Some(ns), Some(name), Some(uid)) if !uid.is_empty() => Ok(dra::Claim {
                    namespace: ns.into(),
                    name: name.into(),
                    uid: uid.into(),
                }),
                _ => Err(format!("{a}: give NAMESPACE/NAME/UID").into()),
            }
        })
        .collect()
}

async fn run(args: &[String]) -> Result<(), Error> {
    if args.first().map(String::as_str) == Some("restart") {
        return restart(&args[1..]).await;
    }
    if let (Some(cmd @ ("start-pod" | "stop-pod")), Some(state), Some(sock), Some(pod)) = (
        args.first().map(String::as_str),
        args.get(1),
        args.get(2),
        args.get(3),
    ) {
        return pod_command(cmd, Path::new(state), Path::new(sock), pod, &args[4..]).await;
    }
    let (Some(cmd), Some(sock)) = (args.first(), args.get(1)) else {
        return Err(USAGE.into());
    };
    let sock = Path::new(sock);
    match cmd.as_str() {
        "register" => {
            let r = plugin_watcher::register(sock).await;
            println!("{}", r.json());
            if let Some(e) = r.error {
                return Err(e.into());
            }
        }
        "prepare" => {
            let mut c = dra::dra_plugin_client::DraPluginClient::new(channel(sock).await?);
            let r = c
                .node_prepare_resources(dra::NodePrepareResourcesRequest {
                    claims: claims(&args[2..])?,
                })
                .await?
                .into_inner();
            for (uid, a) in r.claims {
                let devices: Vec<_> = a
                    .devices
                    .iter()
                    .map(|d| serde_json::json!({"pool": d.pool_name, "device": d.device_name, "cdi": d.cdi_device_ids}))
                    .collect();
                println!(
                    "{}",
                    serde_json::json!({"uid": uid, "devices": devices, "error": a.error})
                );
            }
        }
        "unprepare" => {
            let mut c = dra::dra_plugin_client::DraPluginClient::new(channel(sock).await?);
            let r = c
                .node_unprepare_resources(dra::NodeUnprepareResourcesRequest {
                    claims: claims(&args[2..])?,
                })
                .await?
                .into_inner();
            for (uid, a) in r.claims {
                println!("{}", serde_json::json!({"uid": uid, "error": a.error}));
            }
        }
        _ => return Err(USAGE.into()),
    }
    Ok(())
}

/// `start-pod` / `stop-pod`: the DRA manager, its cache loaded from and saved to `state`.
async fn pod_command(
    cmd: &str,
    state: &Path,
    sock: &Path,
    pod: &str,
    rest: &[String],
) -> Result<(), Error> {
    let mut m = match std::fs::read(state) {
        Ok(b) => DraManager::load(sock, &serde_json::from_slice(&b)?)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => DraManager::new(sock),
        Err(e) => return Err(format!("{}: {e}", state.display()).into()),
    };
    let result = if cmd == "start-pod" {
        m.prepare_pod(pod, &claims(rest)?).await.map(|devices| {
            let devices: serde_json::Map<_, _> = devices
                .into_iter()
                .map(|(uid, ds)| {
                    let cdi: Vec<_> = ds.iter().flat_map(|d| d.cdi_device_ids.clone()).collect();
                    (uid, serde_json::json!(cdi))
                })
                .collect();
            serde_json::json!({"pod": pod, "started": true, "cdi": devices})
        })
    } else {
        m.unprepare_pod(pod)
            .await
            .map(|()| serde_json::json!({"pod": pod, "stopped": true}))
    };
    std::fs::write(state, serde_json::to_vec(&m.save())?)?;
    let calls =
        serde_json::json!({"prepare_calls": m.prepare_calls, "unprepare_calls": m.unprepare_calls});
    match result {
        Ok(mut v) => {
            v["calls"] = calls;
            println!("{v}");
            Ok(())
        }
        Err(e) => {
            println!(
                "{}",
                serde_json::json!({"pod": pod, "started": false, "error": e, "calls": calls})
            );
            Err(e.into())
        }
    }
}

/// `restart`: its flags, each once, the directories existing, then the restart.
async fn restart(args: &[String]) -> Result<(), Error> {
    let mut r = Restart {
        wipe_attempts: 5,
        ..Restart::default()
    };
    let (mut api, mut node) = (None, None);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let Some(value) = it.next().filter(|v| !v.starts_with("--")) else {
            return Err(format!("restart: {flag} needs a value\n{USAGE}").into());
        };
        let slot = match flag.as_str() {
            "--device-plugins-dir" => {
                set_dir(&mut r.device_plugins_dir, flag, value)?;
                continue;
            }
            "--registry-dir" => {
                set_dir(&mut r.registry_dir, flag, value)?;
                continue;
            }
            "--api-server" => &mut api,
            "--node" => &mut node,
            _ => return Err(format!("restart: unknown argument {flag}\n{USAGE}").into()),
        };
        if slot.replace(value.clone()).is_some() {
            return Err(format!("restart: {flag} given twice").into());
        }
    }
    r.api = match (api, node) {
        (Some(url), Some(node)) => {
            fgpu_kubelet_api::stand_in::http::parse_url(&url)?;
            Some((url, node))
        }
        (None, None) => None,
        _ => return Err("restart: --api-server and --node go together".into()),
    };
    if r.device_plugins_dir.is_none() && r.registry_dir.is_none() && r.api.is_none() {
        return Err(format!("restart: nothing to restart\n{USAGE}").into());
    }
    if r.run(|e| println!("{}", e.json())).await {
        Ok(())
    } else {
        Err("restart: a step failed (above)".into())
    }
}

fn set_dir(slot: &mut Option<std::path::PathBuf>, flag: &str, value: &str) -> Result<(), Error> {
    let dir = Path::new(value);
    if !dir.is_dir() {
        return Err(format!("restart: {flag} {value}: not a directory").into());
    }
    if slot.replace(dir.to_path_buf()).is_some() {
        return Err(format!("restart: {flag} given twice").into());
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fgpu-test-kubelet: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(&args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fgpu-test-kubelet: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
