//! The kubelet's side of the APIs, for checking a plugin where no kubelet runs: the
//! `fgpu-test-kubelet` command and fgpu's end-to-end tests use the same code.

pub mod dra_manager;

use std::path::{Path, PathBuf};

use tonic::transport::{Channel, Endpoint};

/// A gRPC channel to the Unix socket `path` (as the kubelet dials a plugin).
pub async fn channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_path_buf();
    Endpoint::from_static("http://[::]:0")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let p = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(p).await?,
                ))
            }
        }))
        .await
}
