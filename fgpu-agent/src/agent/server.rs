//! The control socket: one request frame in, one reply frame out, per connection turn.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use bytes::BytesMut;
use fgpu_common::proto::{Frame, Kind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use super::control::{self, Peer};
use super::report::State;

/// Binds the socket, refusing to take over from a running agent.
///
/// The socket is connectable by everyone (0666) because shims inside containers, running as
/// any user, introduce themselves on it; every control request is authorised by the peer's
/// credentials (SO_PEERCRED) in [`control::answer`].
pub fn bind(path: &Path) -> Result<UnixListener> {
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        bail!(
            "another fgpu agent is already serving {} (stop it first, or use --socket)",
            path.display()
        );
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let _ = std::fs::remove_file(path); // a stale socket from an agent that died
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(listener)
}

pub async fn serve(listener: UnixListener, state: Arc<State>) -> Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            if let Err(err) = handle(stream, &state).await {
                tracing::debug!("control connection ended: {err:#}");
            }
        });
    }
}

async fn handle(mut stream: UnixStream, state: &State) -> Result<()> {
    let cred = stream.peer_cred()?;
    let peer = Peer {
        pid: cred.pid().and_then(|p| u32::try_from(p).ok()),
        uid: cred.uid(),
        gid: cred.gid(),
    };
    let mut buf = BytesMut::with_capacity(4096);
    loop {
        let frame = loop {
            match Frame::decode(&mut buf) {
                Ok(Some(frame)) => break frame,
                Ok(None) => {}
                Err(err) => {
                    reply(&mut stream, Frame::new(Kind::Error, err.to_string())).await?;
                    return Err(err.into());
                }
            }
            if stream.read_buf(&mut buf).await? == 0 {
                return Ok(());
            }
        };
        let answer = control::answer(state, peer, &frame);
        reply(&mut stream, answer).await?;
    }
}

async fn reply(stream: &mut UnixStream, frame: Frame) -> Result<()> {
    let mut out = BytesMut::new();
    frame.encode(&mut out)?;
    stream.write_all(&out).await?;
    Ok(())
}
