//! Observability: `--metrics ADDR` serves the metrics (`/metrics`: OpenMetrics or the classic
//! text format, as the scraper's `Accept` asks), liveness (`/healthz`) and readiness
//! (`/readyz`) on one small HTTP listener (docs/observability.md).
//!
//! The listener starts before anything else (so that `/readyz` answers "not ready" while the
//! probes are being attached) on a thread and runtime of its own: a slow scraper never holds
//! up the agent. Figures come from [`State::report`], the report `fgpu status --json` prints,
//! sampled at most once per [`PUBLISH_EVERY`]: a cgroup that is gone from the report has no
//! series from the next sample on.

mod admission;
mod classic;
pub mod eventlog;
mod families;
mod http;
mod model;
mod negotiate;
mod openmetrics;
mod sample;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hyper::body::Bytes;

use super::state::State;

/// A scrape reuses the sample taken less than this long ago.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(1);
/// The agent's loop beats this often...
const BEAT_EVERY: Duration = Duration::from_secs(1);
/// ...and is not alive once it missed beats for this long.
const BEAT_STALE: Duration = Duration::from_secs(10);

/// What `/healthz` and `/readyz` report.
#[derive(Debug)]
pub struct Health {
    started: Instant,
    /// Milliseconds after `started` of the loop's last beat; 0: it has not run yet.
    beat_ms: AtomicU64,
    probes: AtomicBool,
    sockets: AtomicBool,
}

impl Health {
    fn new() -> Self {
        Health {
            started: Instant::now(),
            beat_ms: AtomicU64::new(0),
            probes: AtomicBool::new(false),
            sockets: AtomicBool::new(false),
        }
    }

    fn beat(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.beat_ms.store(ms.max(1), Ordering::Relaxed);
    }

    /// How long ago the loop beat; `None` before it first ran.
    fn since_beat(&self) -> Option<Duration> {
        match self.beat_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(
                self.started
                    .elapsed()
                    .saturating_sub(Duration::from_millis(ms)),
            ),
        }
    }

    /// Liveness: the agent's loop beat recently (or the agent is still starting).
    pub fn alive(&self) -> (bool, String) {
        match self.since_beat() {
            None => (true, "starting\n".into()),
            Some(d) if d < BEAT_STALE => (true, "ok\n".into()),
            Some(d) => (
                false,
                format!(
                    "the agent's loop has not run for {:.1} s\n",
                    d.as_secs_f64()
                ),
            ),
        }
    }

    /// Readiness: probes attached, both sockets served, the loop alive.
    pub fn ready(&self) -> (bool, String) {
        if !self.probes.load(Ordering::Relaxed) {
            return (false, "not ready: the probes are not attached yet\n".into());
        }
        if !self.sockets.load(Ordering::Relaxed) {
            return (false, "not ready: the sockets are not served yet\n".into());
        }
        match self.alive() {
            (true, _) => (true, "ready\n".into()),
            (false, why) => (false, format!("not ready: {why}")),
        }
    }

    fn is_ready(&self) -> bool {
        self.ready().0
    }
}

/// What the listener shares with the agent.
pub struct Shared {
    pub health: Health,
    state: OnceLock<Arc<State>>,
    hostname: String,
    /// The last sample's bodies (OpenMetrics, classic) and when it was taken.
    cache: Mutex<Option<(Instant, [Bytes; 2])>>,
}

impl Shared {
    /// The body in `format` (with `format`, for its content type); `None` until the agent's
    /// state exists. Both formats of one publish interval come from the same sample.
    fn metrics_body(&self, format: negotiate::Format) -> Option<(negotiate::Format, Bytes)> {
        let state = self.state.get()?;
        let pick = |bodies: &[Bytes; 2]| match format {
            negotiate::Format::OpenMetrics => bodies[0].clone(),
            negotiate::Format::Classic => bodies[1].clone(),
        };
        let mut cache = self.cache.lock().expect("metrics cache lock");
        if let Some((at, bodies)) = cache.as_ref()
            && at.elapsed() < PUBLISH_EVERY
        {
            return Some((format, pick(bodies)));
        }
        let sample = sample::take(state, &self.hostname, self.health.is_ready());
        let families = families::families(&sample);
        let bodies = [
            Bytes::from(openmetrics::encode(&families)),
            Bytes::from(classic::encode(&families)),
        ];
        let body = pick(&bodies);
        *cache = Some((Instant::now(), bodies));
        Some((format, body))
    }
}

/// The agent's handle on its listener (and on its health, which the listener reports).
#[derive(Clone)]
pub struct Metrics(Arc<Shared>);

impl Metrics {
    /// Binds `addr` and serves it from a thread of its own. A port of 0 takes a free one;
    /// the address is logged either way.
    pub fn start(addr: SocketAddr) -> Result<Metrics> {
        let listener = std::net::TcpListener::bind(addr)
            .with_context(|| format!("--metrics {addr}: cannot listen there"))?;
        listener.set_nonblocking(true)?;
        let bound = listener.local_addr()?;
        let shared = Arc::new(Shared {
            health: Health::new(),
            state: OnceLock::new(),
            hostname: hostname(),
            cache: Mutex::new(None),
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the metrics runtime")?;
        let served = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("fgpu-metrics".into())
            .spawn(move || {
                runtime.block_on(async move {
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => http::serve(l, served).await,
                        Err(err) => tracing::error!("metrics listener: {err}"),
                    }
                });
            })
            .context("starting the metrics thread")?;
        tracing::info!(
            address = %bound,
            "metrics: serving /metrics, /healthz and /readyz on http://{bound}"
        );
        Ok(Metrics(shared))
    }

    pub fn probes_attached(&self) {
        self.0.health.probes.store(true, Ordering::Relaxed);
    }

    pub fn sockets_served(&self) {
        self.0.health.sockets.store(true, Ordering::Relaxed);
    }

    pub fn set_state(&self, state: &Arc<State>) {
        let _ = self.0.state.set(Arc::clone(state));
    }

    /// Beats for `/healthz` from the agent's own runtime, until the agent stops.
    pub async fn beat(self) {
        let mut tick = tokio::time::interval(BEAT_EVERY);
        loop {
            tick.tick().await;
            self.0.health.beat();
        }
    }
}

/// The node's name for the `Hostname` label: `$NODE_NAME` (a Kubernetes daemonset sets it
/// from the downward API, as DCGM's exporter does), else the kernel's host name.
fn hostname() -> String {
    std::env::var("NODE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
