//! `fgpu-test-kubelet`: the kubelet's side of the plugin-registration and DRA APIs, as a
//! command, for checking a DRA plugin on a machine without a kubelet (tests/gpu/k8s_prepare.sh).
//! Prints the plugin's answers as JSON lines.
//!
//!   fgpu-test-kubelet register REG_SOCK
//!   fgpu-test-kubelet prepare DRA_SOCK NAMESPACE/NAME/UID...
//!   fgpu-test-kubelet unprepare DRA_SOCK NAMESPACE/NAME/UID...
//!   fgpu-test-kubelet start-pod STATE DRA_SOCK POD_UID NAMESPACE/NAME/UID...
//!   fgpu-test-kubelet stop-pod STATE DRA_SOCK POD_UID
//!
//! `prepare` and `unprepare` are the bare calls. `start-pod` and `stop-pod` act as the
//! kubelet's DRA manager does for a pod (pkg/kubelet/cm/dra/manager.go, shared with the
//! end-to-end tests: `fgpu_kubelet_api::stand_in::dra_manager`): a claim already prepared on
//! the node is not prepared again, a failed prepare fails the pod (exit 1, upstream's
//! message), and only the last pod's stop unprepares a claim. STATE is the manager's claim
//! cache, kept between commands as the kubelet checkpoints it; it prints the calls it made.

use std::path::Path;

use fgpu_kubelet_api::stand_in::dra_manager::DraManager;

use fgpu_kubelet_api::dra::v1 as dra;
use fgpu_kubelet_api::pluginregistration as reg;

type Error = Box<dyn std::error::Error>;

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
    let usage = "usage: fgpu-test-kubelet register REG_SOCK | prepare DRA_SOCK NS/NAME/UID... | unprepare DRA_SOCK NS/NAME/UID... | start-pod STATE DRA_SOCK POD_UID NS/NAME/UID... | stop-pod STATE DRA_SOCK POD_UID";
    if let (Some(cmd @ ("start-pod" | "stop-pod")), Some(state), Some(sock), Some(pod)) = (
        args.first().map(String::as_str),
        args.get(1),
        args.get(2),
        args.get(3),
    ) {
        return pod_command(cmd, Path::new(state), Path::new(sock), pod, &args[4..]).await;
    }
    let (Some(cmd), Some(sock)) = (args.first(), args.get(1)) else {
        return Err(usage.into());
    };
    let sock = Path::new(sock);
    match cmd.as_str() {
        "register" => {
            let mut c = reg::registration_client::RegistrationClient::new(channel(sock).await?);
            let info = c.get_info(reg::InfoRequest {}).await?.into_inner();
            c.notify_registration_status(reg::RegistrationStatus {
                plugin_registered: true,
                error: String::new(),
            })
            .await?;
            println!(
                "{}",
                serde_json::json!({"type": info.r#type, "name": info.name, "endpoint": info.endpoint,
                                   "supported_versions": info.supported_versions})
            );
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
        _ => return Err(usage.into()),
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
