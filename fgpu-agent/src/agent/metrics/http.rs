//! The metrics listener: HTTP/1.1 (hyper), bounded in connections (per peer and in all:
//! [`admission`]), header size and time. Routes: `GET /metrics` (OpenMetrics or the classic
//! text format, as the request's `Accept` says: [`negotiate`]), `/healthz`, `/readyz`;
//! anything else is 404, any method but GET/HEAD 405. Request bodies are never read.
//!
//! Nobody can keep the health endpoints from answering: accepting never waits for a free
//! place (a connection is admitted or refused at once), a peer holds at most
//! [`MAX_PER_PEER`] connections, a full listener makes room for a peer that holds less than
//! the peer holding the most, and a connection that does not send a whole request head
//! within [`HEAD_TIMEOUT`] (of opening, or of its previous answer: the keep-alive idle
//! limit too) is closed.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ACCEPT, ALLOW, CONTENT_TYPE, HeaderValue, VARY};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};

use super::Shared;
use super::admission::{Admission, Slot, Slots};
pub use super::admission::{MAX_CONNECTIONS, MAX_PER_PEER};
use super::negotiate::{self, negotiate};

/// A request's head must be whole within this long of the connection opening or of the
/// previous answer on it; so an idle keep-alive connection is closed after this long.
/// (hyper's header read timer runs from the moment it waits for a head.)
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(3);
/// A connection is closed after this long, whatever it does (keep-alive included).
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// The most bytes buffered for a request head.
const MAX_HEAD: usize = 16 * 1024;

pub async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let slots = Slots::new(MAX_CONNECTIONS, MAX_PER_PEER);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(err) => {
                // Out of descriptors and the like: wait a little rather than spin.
                tracing::warn!("metrics listener: accept failed: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        match slots.admit(peer.ip()) {
            Admission::Admitted(slot) => {
                if let Some(from) = slot.took_from {
                    tracing::debug!(%peer, "metrics listener full: closed the oldest connection of {from}, the peer holding the most");
                }
                tokio::spawn(connection(stream, peer, slot, Arc::clone(&shared)));
            }
            Admission::PeerFull => refuse(
                stream,
                peer,
                &format!(
                    "too many connections from {}: at most {MAX_PER_PEER} at once\n",
                    peer.ip().to_canonical()
                ),
            ),
            Admission::Full => refuse(
                stream,
                peer,
                "the metrics listener is full and no peer holds more connections than yours\n",
            ),
        }
    }
}

/// Tells a refused peer why (`503`, if its socket takes that at once: nothing waits on it)
/// and closes the connection.
fn refuse(stream: TcpStream, peer: SocketAddr, why: &str) {
    tracing::debug!(%peer, "metrics connection refused: {}", why.trim_end());
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\n\
         content-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\n\r\n{why}",
        why.len()
    );
    let _ = stream.try_write(answer.as_bytes());
}

async fn connection(stream: TcpStream, peer: SocketAddr, slot: Slot, shared: Arc<Shared>) {
    let service = hyper::service::service_fn(move |req| {
        let shared = Arc::clone(&shared);
        async move { Ok::<_, Infallible>(route(&req, &shared)) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(MAX_HEAD)
        .serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        done = tokio::time::timeout(CONNECTION_TIMEOUT, conn) => match done {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::debug!(%peer, "metrics connection: {err}"),
            Err(_) => {
                tracing::debug!(%peer, "metrics connection closed after {CONNECTION_TIMEOUT:?}")
            }
        },
        () = slot.evicted() => {
            tracing::debug!(%peer, "metrics connection closed: its place went to a peer holding fewer");
        }
    }
    drop(slot);
}

fn route(req: &Request<Incoming>, shared: &Shared) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n".into());
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match req.uri().path() {
        "/metrics" => match shared.metrics_body(format(req)) {
            Some((format, body)) => {
                let mut r = Response::new(Full::new(body));
                let headers = r.headers_mut();
                headers.insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static(format.content_type()),
                );
                // The answer depends on the request's Accept: caches must not mix the two.
                headers.insert(VARY, HeaderValue::from_static("accept"));
                r
            }
            None => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the agent is starting: no metrics yet\n".into(),
            ),
        },
        "/healthz" => {
            let (ok, why) = shared.health.alive();
            text(status(ok), why)
        }
        "/readyz" => {
            let (ok, why) = shared.health.ready();
            text(status(ok), why)
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz or /readyz\n".into(),
        ),
    }
}

/// The format the request's `Accept` header(s) ask for (values that are not visible ASCII
/// are ignored).
fn format(req: &Request<Incoming>) -> negotiate::Format {
    let values: Vec<&str> = req
        .headers()
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    if values.is_empty() {
        return negotiate(None);
    }
    negotiate(Some(&values.join(",")))
}

fn status(ok: bool) -> StatusCode {
    if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

fn text(code: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = code;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}
