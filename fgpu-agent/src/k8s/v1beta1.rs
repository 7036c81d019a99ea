//! The DRAPlugin service in version v1beta1, for kubelets older than 1.34 (a 1.33 kubelet
//! under a 1.34 control plane speaks only v1beta1). Its messages are v1's under another
//! package (fgpu-kubelet-api/proto/dra_v1beta1.proto), so each call is the v1 call
//! ([`super::server::DraService`]) with its messages carried across field by field. The
//! plugin lists both versions in `PluginInfo.supported_versions`; the kubelet picks the
//! newest it knows (pkg/kubelet/cm/dra/plugin/registration.go), as it does for drivers built
//! on k8s.io/dynamic-resource-allocation/kubeletplugin, which serve both by default.

use fgpu_kubelet_api::dra::v1;
use fgpu_kubelet_api::dra::v1beta1 as b1;
use tonic::{Request, Response, Status};

use super::server::DraService;

fn claim(c: b1::Claim) -> v1::Claim {
    v1::Claim {
        namespace: c.namespace,
        uid: c.uid,
        name: c.name,
    }
}

fn device(d: v1::Device) -> b1::Device {
    b1::Device {
        request_names: d.request_names,
        pool_name: d.pool_name,
        device_name: d.device_name,
        cdi_device_ids: d.cdi_device_ids,
    }
}

#[tonic::async_trait]
impl b1::dra_plugin_server::DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<b1::NodePrepareResourcesRequest>,
    ) -> Result<Response<b1::NodePrepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims.into_iter().map(claim).collect();
        let answer = v1::dra_plugin_server::DraPlugin::node_prepare_resources(
            self,
            Request::new(v1::NodePrepareResourcesRequest { claims }),
        )
        .await?
        .into_inner();
        let claims = answer
            .claims
            .into_iter()
            .map(|(uid, r)| {
                let r = b1::NodePrepareResourceResponse {
                    devices: r.devices.into_iter().map(device).collect(),
                    error: r.error,
                };
                (uid, r)
            })
            .collect();
        Ok(Response::new(b1::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<b1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<b1::NodeUnprepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims.into_iter().map(claim).collect();
        let answer = v1::dra_plugin_server::DraPlugin::node_unprepare_resources(
            self,
            Request::new(v1::NodeUnprepareResourcesRequest { claims }),
        )
        .await?
        .into_inner();
        let claims = answer
            .claims
            .into_iter()
            .map(|(uid, r)| (uid, b1::NodeUnprepareResourceResponse { error: r.error }))
            .collect();
        Ok(Response::new(b1::NodeUnprepareResourcesResponse { claims }))
    }
}
