//! The metrics listener: HTTP/1.1 (hyper) on the node network, bounded in connections, header
//! size and time. Routes: `GET /metrics` (OpenMetrics or the classic text format, as the
//! request's `Accept` says: [`negotiate`]), `/healthz`, `/readyz`; anything else is 404, any
//! method but GET/HEAD 405. Request bodies are never read.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ACCEPT, ALLOW, CONTENT_TYPE, HeaderValue, VARY};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::Shared;
use super::negotiate::{self, negotiate};

/// Connections served at once; more wait in the kernel's backlog (a Prometheus server keeps
/// one; a handful of people's curls and probes fit).
pub const MAX_CONNECTIONS: usize = 16;
/// A request's head must arrive within this long.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection is closed after this long, whatever it does (keep-alive included).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(60);
/// The most bytes buffered for a request head.
const MAX_HEAD: usize = 16 * 1024;

pub async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(err) => {
                // Out of descriptors and the like: wait a little rather than spin.
                tracing::warn!("metrics listener: accept failed: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let shared = Arc::clone(&shared);
                async move { Ok::<_, Infallible>(route(&req, &shared)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(MAX_HEAD)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONNECTION_TIMEOUT, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => tracing::debug!(%peer, "metrics connection: {err}"),
                Err(_) => {
                    tracing::debug!(%peer, "metrics connection closed after {CONNECTION_TIMEOUT:?}")
                }
            }
            drop(permit);
        });
    }
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
