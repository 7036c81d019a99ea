//! The control socket: one request frame in, one reply frame out, per connection turn.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use bytes::BytesMut;
use std::os::fd::OwnedFd;

use fgpu_common::cgroup::unified_path;
use fgpu_common::proto::{Frame, Kind, shim};
use tokio::net::{UnixListener, UnixStream};

use super::control::{self, Peer};
use super::report::State;
use super::scm;

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

async fn handle(stream: UnixStream, state: &State) -> Result<()> {
    let cred = stream.peer_cred()?;
    let peer = Peer {
        pid: cred.pid().and_then(|p| u32::try_from(p).ok()),
        uid: cred.uid(),
        gid: cred.gid(),
    };
    let mut buf = BytesMut::with_capacity(4096);
    let mut chunk = vec![0u8; 64 * 1024];
    let mut fds: Vec<OwnedFd> = Vec::new();
    loop {
        let frame = loop {
            match Frame::decode(&mut buf) {
                Ok(Some(frame)) => break frame,
                Ok(None) => {}
                Err(err) => {
                    reply(&stream, Frame::new(Kind::Error, err.to_string())).await?;
                    return Err(err.into());
                }
            }
            let (n, received) = scm::recv(&stream, &mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
            fds.extend(received);
        };
        if frame.kind == Kind::Hello {
            hello(&stream, state, peer, &frame, std::mem::take(&mut fds)).await?;
            continue;
        }
        fds.clear(); // descriptors only ever come with a Hello
        let answer = control::answer(state, peer, &frame);
        reply(&stream, answer).await?;
    }
}

/// A shim introduces itself: find its cgroup from its PID (the kernel's word, not the
/// shim's) and hand over the ledger whose budget that cgroup is under.
async fn hello(
    stream: &UnixStream,
    state: &State,
    peer: Peer,
    frame: &Frame,
    fds: Vec<OwnedFd>,
) -> Result<()> {
    let ledger = (|| -> Result<_> {
        let hello = shim::HelloPayload::decode(&frame.payload).context("malformed Hello")?;
        if hello.version != shim::VERSION {
            bail!(
                "shim protocol version {} is not supported (agent speaks {})",
                hello.version,
                shim::VERSION
            );
        }
        let pid = peer.pid.context("no peer credentials on the socket")?;
        let content = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .with_context(|| format!("reading /proc/{pid}/cgroup"))?;
        let cgroup = unified_path(&content)
            .context("the process is in no cgroup v2")?
            .to_string();
        let usage = (hello.flags & shim::HELLO_HAS_USAGE_FD != 0)
            .then(|| fds.into_iter().next())
            .flatten();
        // The ledger of the nearest limited cgroup, or the process's own (budget.rs).
        super::budget::ledger_of(state, pid, &cgroup, usage)
    })();
    match ledger {
        Ok(ledger) => {
            tracing::debug!(pid = peer.pid, cgroup = %ledger.cgroup, "shim connected");
            let mut out = BytesMut::new();
            Frame::new(Kind::LedgerReply, shim::encode_ledger_reply(&ledger.cgroup))
                .encode(&mut out)?;
            scm::send(stream, &out, &ledger.fds()).await?;
        }
        Err(err) => {
            tracing::warn!(pid = peer.pid, "refused a shim: {err:#}");
            reply(stream, Frame::new(Kind::Error, format!("{err:#}"))).await?;
        }
    }
    Ok(())
}

async fn reply(stream: &UnixStream, frame: Frame) -> Result<()> {
    let mut out = BytesMut::new();
    frame.encode(&mut out)?;
    scm::send(stream, &out, &[]).await?;
    Ok(())
}
