//! The kubelet's gRPC APIs that fgpu's Kubernetes plugins speak, generated at build time
//! from `proto/` (files written to match the published APIs field for field; each cites its
//! upstream path and version):
//!
//! - [`dra::v1`]: `k8s.io/kubelet/pkg/apis/dra/v1`, the DRAPlugin service
//!   (NodePrepareResources, NodeUnprepareResources); [`dra::v1beta1`], the same messages
//!   under `k8s.io/kubelet/pkg/apis/dra/v1beta1` (1.32 and 1.33 kubelets);
//! - [`pluginregistration`]: `k8s.io/kubelet/pkg/apis/pluginregistration/v1`, the
//!   Registration service a plugin serves to the kubelet's plugin watcher;
//! - [`deviceplugin::v1beta1`]: `k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1`, the
//!   Registration service of the kubelet and the DevicePlugin service of a plugin.
//!
//! Both sides are generated (servers for fgpu, clients for tests and tools).

#![allow(clippy::doc_lazy_continuation, clippy::large_enum_variant)]

pub mod dra {
    pub mod v1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    pub mod v1beta1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
    }
}

pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

pub mod deviceplugin {
    pub mod v1beta1 {
        tonic::include_proto!("v1beta1");
    }
}

/// The version string a DRA plugin advertises in `PluginInfo.supported_versions`.
pub const DRA_V1_VERSION: &str = "v1.DRAPlugin";
/// The same for the v1beta1 service.
pub const DRA_V1BETA1_VERSION: &str = "v1beta1.DRAPlugin";
/// `PluginInfo.type` of a DRA plugin.
pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";
/// `RegisterRequest.version` of a v1beta1 device plugin.
pub const DEVICE_PLUGIN_VERSION: &str = "v1beta1";

pub mod stand_in;
