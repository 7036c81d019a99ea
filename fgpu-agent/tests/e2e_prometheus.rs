//! End-to-end: a real Prometheus server (Debian's `prometheus` package; `.ci/run` installs
//! it) scrapes the agent's `/metrics` on the simulated driver every second, once taking the
//! OpenMetrics form (what Prometheus asks for first by default) and once the classic text
//! format, and its query API then has a limited container's figures with the agent's labels.
//!
//! The scrapes go through a small relay that records what Prometheus asked for and what the
//! agent answered (so the test knows which encoder Prometheus read). For the classic run a
//! Prometheus that knows `scrape_protocols` (2.49 and later) is configured with
//! `[PrometheusText0.0.4]`; an older one (Debian 12 has 2.42) always asks for OpenMetrics
//! first, and the relay then sends on the header a 2.49 would send with that setting instead.

mod common;
mod metrics_http;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Agent, Cgroup, Load, SimState, ok, privileged, unique};
use metrics_http::{
    CLASSIC_ACCEPT, CLASSIC_TYPE, OPENMETRICS_TYPE, address_in_log, get, parse_response, raw,
};
use serde_json::Value;

/// What the relay saw of each scrape: the request's `Accept`, the answer's `Content-Type`.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// A one-request-per-connection relay from Prometheus to the agent.
struct Relay {
    addr: String,
    seen: Seen,
}

impl Relay {
    /// `accept`: the `Accept` header to send on in place of Prometheus' own, if any.
    fn start(agent: String, accept: Option<&'static str>) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let seen: Seen = Arc::default();
        let log = Arc::clone(&seen);
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (agent, log) = (agent.clone(), Arc::clone(&log));
                std::thread::spawn(move || {
                    if let Err(e) = relay_one(conn, &agent, accept, &log) {
                        eprintln!("relay: {e}");
                    }
                });
            }
        });
        Relay { addr, seen }
    }
}

/// Relays one GET (its head; a scrape has no body) and the whole answer, then closes.
fn relay_one(
    mut from: TcpStream,
    agent: &str,
    accept: Option<&str>,
    seen: &Seen,
) -> std::io::Result<()> {
    from.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if from.read(&mut byte)? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines: Vec<String> = Vec::new();
    let mut asked = String::new();
    for line in head.split("\r\n").filter(|l| !l.is_empty()) {
        let name = line
            .split(':')
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        if name == "accept" {
            asked = line.split_once(':').unwrap().1.trim().to_string();
        } else if name != "connection" {
            lines.push(line.to_string());
        }
    }
    lines.push(format!("Accept: {}", accept.unwrap_or(&asked)));
    lines.push("Connection: close".into());
    let mut to = TcpStream::connect(agent)?;
    to.write_all(format!("{}\r\n\r\n", lines.join("\r\n")).as_bytes())?;
    let mut answer = Vec::new();
    to.read_to_end(&mut answer)?;
    let content_type = parse_response(&answer)
        .header("content-type")
        .unwrap_or_default()
        .to_string();
    seen.lock().unwrap().push((asked, content_type));
    from.write_all(&answer)
}

/// A Prometheus server on a loopback port, with its own storage; killed on drop.
struct Prometheus {
    child: Child,
    addr: String,
    dir: PathBuf,
}

impl Prometheus {
    fn start(dir: &Path, target: &str, protocols: Option<&str>) -> Prometheus {
        std::fs::create_dir_all(dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(&config, config_text(target, protocols)).unwrap();
        let addr = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect(
                "prometheus is needed (Debian: apt-get install prometheus; .ci/run installs it)",
            );
        let p = Prometheus {
            child,
            addr,
            dir: dir.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let ready = |addr: &str| {
            let head =
                format!("GET /-/ready HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
            raw(addr, head.as_bytes())
                .is_ok_and(|b| !b.is_empty() && parse_response(&b).code == 200)
        };
        while !ready(&p.addr) {
            assert!(
                Instant::now() < deadline,
                "prometheus never ready:\n{}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        p
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// The result vector of an instant query.
    fn query(&self, promql: &str) -> Vec<Value> {
        let r = get(
            &self.addr,
            &format!("/api/v1/query?query={}", encode(promql)),
        );
        let body = if r.header("transfer-encoding") == Some("chunked") {
            dechunk(&r.body)
        } else {
            r.body
        };
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        assert_eq!(v["status"], "success", "{promql}: {v}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The one series of `promql`, once Prometheus has one for which `ok` holds.
    fn wait_for(&self, promql: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let found = self.query(promql);
            if found.len() == 1 && ok(&found[0]) {
                return found[0].clone();
            }
            assert!(
                Instant::now() < deadline,
                "prometheus has no fitting {promql}: {found:?}\ntargets: {:?}\n{}",
                self.query_raw("/api/v1/targets"),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn query_raw(&self, path: &str) -> String {
        get(&self.addr, path).body
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn config_text(target: &str, protocols: Option<&str>) -> String {
    let protocols =
        protocols.map_or_else(String::new, |p| format!("    scrape_protocols: [{p}]\n"));
    format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: fgpu\n{protocols}    static_configs:\n      - targets: ['{target}']\n"
    )
}

/// Whether this Prometheus takes `scrape_protocols` (2.49 and later): promtool says.
fn knows_scrape_protocols(dir: &Path) -> bool {
    std::fs::create_dir_all(dir).unwrap();
    let config = dir.join("probe.yml");
    std::fs::write(
        &config,
        config_text("127.0.0.1:9", Some("PrometheusText0.0.4")),
    )
    .unwrap();
    Command::new("promtool")
        .args(["check", "config"])
        .arg(&config)
        .output()
        .expect("promtool is needed (Debian: apt-get install prometheus)")
        .status
        .success()
}

fn free_port() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// Percent-encoding of a query parameter's value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The body of a chunked answer.
fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

#[test]
fn privileged_a_real_prometheus_scrapes_both_formats() {
    if !privileged() {
        return;
    }
    let agent = Agent::start_with(&["--metrics", "127.0.0.1:0"]);
    let addr = address_in_log(|| agent.log_text());
    let state = SimState::new();
    let cg = Cgroup::new(&unique("fgpu-e2e-prometheus"));
    ok(&agent.cli(&["limit", "set", &cg.path, "--memory", "1GiB"]));
    let mut load = Load::spawn_with_shim(&cg, &state.0, &agent, &["alloc", "256MiB", "hold"]);
    load.expect_line("ready");
    let row = agent
        .wait_for(&cg, "memory in use", Duration::from_secs(30), |s| {
            s.is_some_and(|s| s["devices"][0]["memory_used_bytes"].as_u64() >= Some(256 << 20))
        })
        .unwrap();
    let used = row["devices"][0]["memory_used_bytes"].as_f64().unwrap();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let dir = std::env::temp_dir().join(unique("fgpu-e2e-prometheus"));
    let native = knows_scrape_protocols(&dir);
    eprintln!("prometheus takes scrape_protocols: {native}");

    for (name, want_type) in [("openmetrics", OPENMETRICS_TYPE), ("classic", CLASSIC_TYPE)] {
        let classic = want_type == CLASSIC_TYPE;
        let relay = Relay::start(addr.clone(), (classic && !native).then_some(CLASSIC_ACCEPT));
        let protocols = (classic && native).then_some("PrometheusText0.0.4");
        let prom = Prometheus::start(&dir.join(name), &relay.addr, protocols);

        let memory = format!(r#"fgpu_cgroup_memory_used_bytes{{cgroup="{}"}}"#, cg.path);
        let series = prom.wait_for(&memory, |s| {
            s["value"][1].as_str() == Some(&used.to_string())
        });
        let labels = &series["metric"];
        assert_eq!(labels["gpu"], "0", "{name}: {series}");
        assert!(
            labels["UUID"]
                .as_str()
                .is_some_and(|u| u.starts_with("GPU-")),
            "{series}"
        );
        assert_eq!(labels["Hostname"], host.trim(), "{name}: {series}");
        assert_eq!(labels["job"], "fgpu", "{name}: {series}");
        assert_eq!(labels["instance"], relay.addr.as_str(), "{name}: {series}");
        // A counter and an info read back under their classic names from either format.
        let allocs = format!(r#"fgpu_cgroup_allocations_total{{cgroup="{}"}}"#, cg.path);
        prom.wait_for(&allocs, |s| {
            s["value"][1].as_str().and_then(|v| v.parse::<f64>().ok()) >= Some(1.0)
        });
        let info = prom.wait_for(r#"fgpu_gpu_info{gpu="0"}"#, |s| s["value"][1] == "1");
        assert_eq!(info["metric"]["UUID"], labels["UUID"], "{info}");
        let up = prom.wait_for("up", |s| s["value"][1] == "1");
        assert_eq!(up["metric"]["instance"], relay.addr.as_str());

        // Every scrape was answered in the format the run is about, and asked for it.
        let seen = relay.seen.lock().unwrap().clone();
        assert!(!seen.is_empty(), "{name}: no scrape went through the relay");
        for (asked, answered) in &seen {
            assert_eq!(answered, want_type, "{name}: asked {asked:?}");
            let first = asked.split([',', ';']).next().unwrap_or_default();
            match (classic, native) {
                (false, _) => assert_eq!(first, "application/openmetrics-text", "{asked}"),
                (true, true) => assert_eq!(first, "text/plain", "{asked}"),
                // Sent on as CLASSIC_ACCEPT instead.
                (true, false) => assert_eq!(first, "application/openmetrics-text", "{asked}"),
            }
        }
        eprintln!(
            "{name}: {} scrapes, first asked {:?}",
            seen.len(),
            seen[0].0
        );
        drop(prom);
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(load.finish().success());
}
