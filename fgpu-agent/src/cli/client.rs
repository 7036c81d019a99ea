//! A blocking client of the agent's control socket.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::{Bytes, BytesMut};
use fgpu_common::proto::{Frame, Kind};

/// Sends one request and returns the reply's payload; an agent error becomes an error here.
pub fn request(socket: &Path, kind: Kind, payload: Bytes, expect: Kind) -> Result<Bytes> {
    let mut stream = UnixStream::connect(socket).map_err(|err| match err.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => anyhow::anyhow!(
            "the fgpu agent is not running (no socket at {}): start it with `sudo fgpu agent` \
             (or `cargo xtask run`)",
            socket.display()
        ),
        std::io::ErrorKind::PermissionDenied => anyhow::anyhow!(
            "permission denied on {}: the agent's admin socket is root-only (try sudo)",
            socket.display()
        ),
        _ => anyhow::Error::new(err).context(format!("connecting to {}", socket.display())),
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut out = BytesMut::new();
    Frame::new(kind, payload).encode(&mut out)?;
    stream.write_all(&out).context("sending the request")?;

    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut chunk = [0u8; 64 * 1024];
    loop {
        if let Some(frame) = Frame::decode(&mut buf)? {
            if frame.kind == Kind::Error {
                bail!(
                    "the agent refused: {}",
                    String::from_utf8_lossy(&frame.payload)
                );
            }
            if frame.kind != expect {
                bail!("the agent answered {:?} to a {kind:?}", frame.kind);
            }
            return Ok(frame.payload);
        }
        let n = stream
            .read(&mut chunk)
            .context("reading the agent's reply")?;
        if n == 0 {
            bail!("the agent closed the connection without answering");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}
