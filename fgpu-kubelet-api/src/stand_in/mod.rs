//! The kubelet's side of the APIs, for checking a plugin where no kubelet runs: the
//! `fgpu-test-kubelet` command and fgpu's end-to-end tests use the same code. Each module
//! follows the kubernetes/kubernetes file it names: the DRA manager's claim cache
//! ([`dra_manager`]), and a kubelet restart ([`restart`]: the device manager's cleanup
//! ([`device_manager`]), the node's ResourceSlices wiped ([`resource_slices`], over
//! [`http`]), the plugin watcher's registrations ([`plugin_watcher`])).

pub mod device_manager;
pub mod dra_manager;
pub mod http;
pub mod plugin_watcher;
pub mod resource_slices;
pub mod restart;

use std::path::{Path, PathBuf};

use tonic::transport::{Channel, Endpoint};

/// A gRPC channel to the Unix socket `path` (as the kubelet dials a plugin).
pub async fn channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_path_buf();
    Endpoint::from_static("http://[::]:0")
        .connect_with_connector(tower::service_fn(move |_: ::http::Uri| {
            let p = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(p).await?,
                ))
            }
        }))
        .await
}
