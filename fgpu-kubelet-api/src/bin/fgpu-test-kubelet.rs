//! `fgpu-test-kubelet`: the kubelet's side of the plugin-registration and DRA APIs, as a
//! command, for checking a DRA plugin on a machine without a kubelet (tests/gpu/k8s_prepare.sh).
//! Prints the plugin's answers as JSON lines.
//!
//!   fgpu-test-kubelet register REG_SOCK
//!   fgpu-test-kubelet prepare DRA_SOCK NAMESPACE/NAME/UID...
//!   fgpu-test-kubelet unprepare DRA_SOCK NAMESPACE/NAME/UID...

use std::path::{Path, PathBuf};

use fgpu_kubelet_api::dra::v1 as dra;
use fgpu_kubelet_api::pluginregistration as reg;

type Error = Box<dyn std::error::Error>;

async fn channel(path: &Path) -> Result<tonic::transport::Channel, Error> {
    let p: PathBuf = path.to_path_buf();
    Ok(tonic::transport::Endpoint::try_from("http://[::]:0")?
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let p = p.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(p).await?,
                ))
            }
        }))
        .await?)
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
    let usage = "usage: fgpu-test-kubelet register REG_SOCK | prepare DRA_SOCK NS/NAME/UID... | unprepare DRA_SOCK NS/NAME/UID...";
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
