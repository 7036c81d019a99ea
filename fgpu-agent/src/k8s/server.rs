//! The gRPC side: the DRAPlugin service (dra.sock; v1 here, v1beta1 in `super::v1beta1`)
//! and the Registration service the kubelet's plugin watcher calls (<driver>-reg.sock), on
//! Unix sockets.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use fgpu_kubelet_api::dra::v1 as dra;
use fgpu_kubelet_api::pluginregistration as reg;
use tonic::{Request, Response, Status};

use super::driver::Driver;

pub struct DraService(pub Arc<Driver>);

#[tonic::async_trait]
impl dra::dra_plugin_server::DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<dra::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra::NodePrepareResourcesResponse>, Status> {
        let mut claims = std::collections::HashMap::new();
        for c in request.into_inner().claims {
            let answer = match self.0.prepare(&c.namespace, &c.name, &c.uid).await {
                Ok(Some(p)) => dra::NodePrepareResourceResponse {
                    devices: vec![dra::Device {
                        request_names: p.plan.requests.clone(),
                        pool_name: p.plan.pool.clone(),
                        device_name: p.plan.device.clone(),
                        cdi_device_ids: p.cdi_ids.clone(),
                    }],
                    error: String::new(),
                },
                Ok(None) => dra::NodePrepareResourceResponse::default(),
                Err(err) => {
                    tracing::warn!(claim = %format!("{}/{}", c.namespace, c.name), uid = %c.uid, "prepare failed: {err:#}");
                    dra::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error: format!("fgpu: claim {}/{}: {err:#}", c.namespace, c.name),
                    }
                }
            };
            claims.insert(c.uid, answer);
        }
        Ok(Response::new(dra::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<dra::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra::NodeUnprepareResourcesResponse>, Status> {
        let mut claims = std::collections::HashMap::new();
        for c in request.into_inner().claims {
            let error = match self.0.unprepare(&c.uid).await {
                Ok(()) => String::new(),
                Err(err) => format!("fgpu: claim {}/{}: {err:#}", c.namespace, c.name),
            };
            claims.insert(c.uid, dra::NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(dra::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}

pub struct RegistrationService {
    pub driver: String,
    pub endpoint: String,
}

#[tonic::async_trait]
impl reg::registration_server::Registration for RegistrationService {
    async fn get_info(
        &self,
        _: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(reg::PluginInfo {
            r#type: fgpu_kubelet_api::DRA_PLUGIN_TYPE.into(),
            name: self.driver.clone(),
            endpoint: self.endpoint.clone(),
            // The newest first; the v1beta1 service is crate::k8s::v1beta1.
            supported_versions: vec![
                fgpu_kubelet_api::DRA_V1_VERSION.into(),
                fgpu_kubelet_api::DRA_V1BETA1_VERSION.into(),
            ],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let s = request.into_inner();
        if s.plugin_registered {
            tracing::info!(driver = %self.driver, "registered with the kubelet");
        } else {
            tracing::error!(driver = %self.driver, "the kubelet refused the registration: {}", s.error);
        }
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

/// Binds a Unix socket at `path` (a stale one removed; its directory made).
pub fn bind(path: &Path) -> Result<tokio_stream::wrappers::UnixListenerStream> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing the stale {}", path.display())),
    }
    let l = tokio::net::UnixListener::bind(path)
        .with_context(|| format!("binding {}", path.display()))?;
    Ok(tokio_stream::wrappers::UnixListenerStream::new(l))
}

/// A gRPC channel to a Unix socket.
pub async fn connect(path: &Path) -> Result<tonic::transport::Channel> {
    let p = path.to_path_buf();
    tonic::transport::Endpoint::try_from("http://[::]:0")?
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let p = p.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(p).await?,
                ))
            }
        }))
        .await
        .with_context(|| format!("connecting to {}", path.display()))
}
