//! A test "kubelet": the plugin watcher's registration handshake and the DRA calls, over the
//! real gRPC APIs (clients generated from the same .proto files as the plugin's servers), on
//! the plugin's Unix sockets.

use std::path::{Path, PathBuf};

use fgpu_kubelet_api::dra::v1 as dra;
use fgpu_kubelet_api::pluginregistration as reg;
use tonic::transport::{Channel, Endpoint};

pub async fn channel(path: &Path) -> Channel {
    let path: PathBuf = path.to_path_buf();
    Endpoint::try_from("http://[::]:0")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let p = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(p).await?,
                ))
            }
        }))
        .await
        .expect("connecting to the plugin's socket")
}

/// GetInfo, then NotifyRegistrationStatus(registered): the plugin's info.
pub async fn register(reg_sock: &Path) -> reg::PluginInfo {
    let mut c = reg::registration_client::RegistrationClient::new(channel(reg_sock).await);
    let info = c.get_info(reg::InfoRequest {}).await.unwrap().into_inner();
    c.notify_registration_status(reg::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    })
    .await
    .unwrap();
    info
}

pub fn claim(namespace: &str, name: &str, uid: &str) -> dra::Claim {
    dra::Claim {
        namespace: namespace.into(),
        uid: uid.into(),
        name: name.into(),
    }
}

pub async fn prepare(
    dra_sock: &Path,
    claims: Vec<dra::Claim>,
) -> dra::NodePrepareResourcesResponse {
    let mut c = dra::dra_plugin_client::DraPluginClient::new(channel(dra_sock).await);
    c.node_prepare_resources(dra::NodePrepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner()
}

pub async fn unprepare(
    dra_sock: &Path,
    claims: Vec<dra::Claim>,
) -> dra::NodeUnprepareResourcesResponse {
    let mut c = dra::dra_plugin_client::DraPluginClient::new(channel(dra_sock).await);
    c.node_unprepare_resources(dra::NodeUnprepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner()
}

/// The kubelet's device-plugin Registration service, recording what plugins register.
#[derive(Clone, Default)]
pub struct DeviceRegistry(pub std::sync::Arc<std::sync::Mutex<Vec<dp::RegisterRequest>>>);

use fgpu_kubelet_api::deviceplugin::v1beta1 as dp;

#[tonic::async_trait]
impl dp::registration_server::Registration for DeviceRegistry {
    async fn register(
        &self,
        r: tonic::Request<dp::RegisterRequest>,
    ) -> Result<tonic::Response<dp::Empty>, tonic::Status> {
        self.0.lock().unwrap().push(r.into_inner());
        Ok(tonic::Response::new(dp::Empty {}))
    }
}

/// Serves `registry` on `sock` (the kubelet's kubelet.sock) in the current runtime.
pub fn serve_registry(sock: &Path, registry: DeviceRegistry) {
    let _ = std::fs::remove_file(sock);
    let l = tokio::net::UnixListener::bind(sock).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(dp::registration_server::RegistrationServer::new(registry))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(l)),
    );
}
