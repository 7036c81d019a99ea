//! A test "kubelet": the plugin watcher's registration handshake and the DRA calls, over the
//! real gRPC APIs (clients generated from the same .proto files as the plugin's servers), on
//! the plugin's Unix sockets.

use std::path::Path;

use fgpu_kubelet_api::dra::v1 as dra;
use fgpu_kubelet_api::pluginregistration as reg;
use tonic::transport::Channel;

pub async fn channel(path: &Path) -> Channel {
    fgpu_kubelet_api::stand_in::channel(path)
        .await
        .expect("connecting to the plugin's socket")
}

/// The plugin watcher's registration (GetInfo, the DRA handler's checks,
/// NotifyRegistrationStatus: `fgpu_kubelet_api::stand_in::plugin_watcher`), which must
/// succeed: the plugin's info.
pub async fn register(reg_sock: &Path) -> reg::PluginInfo {
    let r = fgpu_kubelet_api::stand_in::plugin_watcher::register(reg_sock).await;
    assert_eq!(r.error, None, "registration of {}", reg_sock.display());
    r.info.expect("a registered plugin's info")
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

use fgpu_kubelet_api::dra::v1beta1 as b1;

/// The same claims as v1beta1 messages.
fn b1_claims(claims: Vec<dra::Claim>) -> Vec<b1::Claim> {
    claims
        .into_iter()
        .map(|c| b1::Claim {
            namespace: c.namespace,
            uid: c.uid,
            name: c.name,
        })
        .collect()
}

/// NodePrepareResources as a 1.32 or 1.33 kubelet calls it (the v1beta1 service, whose
/// messages are v1's), answered in v1's types for comparison.
pub async fn prepare_v1beta1(
    dra_sock: &Path,
    claims: Vec<dra::Claim>,
) -> dra::NodePrepareResourcesResponse {
    let mut c = b1::dra_plugin_client::DraPluginClient::new(channel(dra_sock).await);
    let claims = b1_claims(claims);
    let r = c
        .node_prepare_resources(b1::NodePrepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner();
    let claims = r
        .claims
        .into_iter()
        .map(|(uid, r)| {
            let devices = r
                .devices
                .into_iter()
                .map(|d| dra::Device {
                    request_names: d.request_names,
                    pool_name: d.pool_name,
                    device_name: d.device_name,
                    cdi_device_ids: d.cdi_device_ids,
                })
                .collect();
            let error = r.error;
            (uid, dra::NodePrepareResourceResponse { devices, error })
        })
        .collect();
    dra::NodePrepareResourcesResponse { claims }
}

/// NodeUnprepareResources over v1beta1: each claim's error.
pub async fn unprepare_v1beta1(
    dra_sock: &Path,
    claims: Vec<dra::Claim>,
) -> std::collections::HashMap<String, String> {
    let mut c = b1::dra_plugin_client::DraPluginClient::new(channel(dra_sock).await);
    let claims = b1_claims(claims);
    let r = c
        .node_unprepare_resources(b1::NodeUnprepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner();
    r.claims.into_iter().map(|(k, v)| (k, v.error)).collect()
}

/// The kubelet's device-plugin Registration service, recording what plugins register. As
/// the kubelet does (pkg/kubelet/cm/devicemanager/plugin/v1beta1/server.go, `Register` →
/// `connectClient`), a registration whose endpoint socket cannot be dialled in the
/// device-plugins directory is refused.
#[derive(Clone)]
pub struct DeviceRegistry {
    pub regs: std::sync::Arc<std::sync::Mutex<Vec<dp::RegisterRequest>>>,
    dir: std::path::PathBuf,
}

impl DeviceRegistry {
    /// For plugins of the device-plugins directory `dir`.
    pub fn new(dir: &Path) -> Self {
        Self {
            regs: Default::default(),
            dir: dir.to_path_buf(),
        }
    }
}

use fgpu_kubelet_api::deviceplugin::v1beta1 as dp;

#[tonic::async_trait]
impl dp::registration_server::Registration for DeviceRegistry {
    async fn register(
        &self,
        r: tonic::Request<dp::RegisterRequest>,
    ) -> Result<tonic::Response<dp::Empty>, tonic::Status> {
        let r = r.into_inner();
        let ep = self.dir.join(&r.endpoint);
        let dial = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            tokio::net::UnixStream::connect(&ep),
        )
        .await;
        if !matches!(dial, Ok(Ok(_))) {
            return Err(tonic::Status::unknown(format!(
                "failed to dial device plugin with socketPath {}",
                ep.display()
            )));
        }
        self.regs.lock().unwrap().push(r);
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

/// What a kubelet that starts does to the device-plugins directory `dir`: its sockets go
/// but for the checkpoint (`fgpu_kubelet_api::stand_in::device_manager`, after
/// pkg/kubelet/cm/devicemanager/manager.go), then it serves registrations on a new
/// kubelet.sock. `registry` forgets the registrations it had.
pub fn restart_device_manager(dir: &Path, registry: &DeviceRegistry) {
    fgpu_kubelet_api::stand_in::device_manager::cleanup_plugin_directory(dir)
        .expect("the device manager's cleanup");
    registry.regs.lock().unwrap().clear();
    serve_registry(
        &dir.join(fgpu_kubelet_api::stand_in::device_manager::KUBELET_SOCKET),
        registry.clone(),
    );
}
