//! End-to-end: the agent's `--metrics` listener on the simulated driver. Two limited
//! containers (cgroups in PID namespaces, the shim preloaded) allocate past their limits; the
//! scrape agrees with `fgpu status --json`, its classic form (what a plain client gets) passes
//! `promtool check metrics` as served and its OpenMetrics form (what Prometheus asks for)
//! carries the same series, a removed cgroup's series go within one publish interval; `/readyz` is not ready before the probes
//! are attached; the listener holds up against clients that misbehave; limit changes and
//! denials reach the JSON log as events.

mod common;
mod metrics_http;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Agent, Cgroup, Load, SimState, ok, privileged, sim_dir, unique};
use metrics_http::{
    CLASSIC_ACCEPT, CLASSIC_TYPE, OPENMETRICS_TYPE, PROMETHEUS_ACCEPT, Series, address_in_log,
    find, flood, get, one, promtool, request_with, sample_set, scrape, scrape_openmetrics,
};
use serde_json::Value;

/// The agent's publish interval (`PUBLISH_EVERY`): a scrape reuses a sample this young.
const PUBLISH: Duration = Duration::from_secs(1);

/// A load under the shim that allocates 256 MiB at a time past its limit (refused), then
/// fills the limit exactly and asks for one byte more (refused), and holds: two denials.
fn limited_load(agent: &Agent, state: &SimState, cg: &Cgroup, fits: u64) -> Load {
    let mut args: Vec<&str> = Vec::new();
    for _ in 0..=fits {
        args.extend(["alloc", "256MiB"]);
    }
    // Exactly what is left (212 MiB), then one byte more (refused).
    args.extend(["alloc", "212MiB", "alloc", "1", "hold"]);
    let mut load = Load::spawn_with_shim(cg, &state.0, agent, &args);
    load.expect_line("ready");
    load
}

/// Every figure of every status row against the scrape; `Err` says what differs.
fn compare(status: &Value, detail: &Value, m: &[Series]) -> Result<(), String> {
    let rows = status.as_array().unwrap();
    let mut in_metrics: Vec<&str> = find(m, "fgpu_cgroup_processes", &[])
        .iter()
        .map(|s| s.labels["cgroup"].as_str())
        .collect();
    in_metrics.sort_unstable();
    let mut in_status: Vec<&str> = rows.iter().map(|r| r["cgroup"].as_str().unwrap()).collect();
    in_status.sort_unstable();
    if in_metrics != in_status {
        return Err(format!(
            "cgroups: metrics {in_metrics:?}, status {in_status:?}"
        ));
    }
    for r in rows {
        let cg = r["cgroup"].as_str().unwrap();
        let at = [("cgroup", cg)];
        let get = |name: &str| find(m, name, &at).first().map(|s| s.value);
        let checks: [(&str, Option<f64>, Option<f64>); 7] = [
            (
                "fgpu_cgroup_memory_subtree_bytes",
                get("fgpu_cgroup_memory_subtree_bytes"),
                r["memory_subtree_bytes"].as_f64(),
            ),
            (
                "fgpu_cgroup_memory_limit_bytes",
                get("fgpu_cgroup_memory_limit_bytes"),
                r["memory_limit_bytes"].as_f64(),
            ),
            (
                "fgpu_cgroup_alloc_denied_reported_total",
                get("fgpu_cgroup_alloc_denied_reported_total"),
                r["alloc_denied"].as_f64(),
            ),
            (
                "fgpu_cgroup_backstop_actions_total",
                get("fgpu_cgroup_backstop_actions_total"),
                r["over_limit_actions"].as_f64(),
            ),
            (
                "fgpu_cgroup_kernel_kills_total",
                get("fgpu_cgroup_kernel_kills_total"),
                r["kernel_kills"].as_f64(),
            ),
            (
                "fgpu_cgroup_processes",
                get("fgpu_cgroup_processes"),
                Some(r["pids"].as_array().unwrap().len() as f64),
            ),
            (
                "fgpu_cgroup_compute_share_ratio",
                get("fgpu_cgroup_compute_share_ratio"),
                r["compute_share_pct"].as_f64().map(|p| p / 100.0),
            ),
        ];
        for (name, metric, want) in checks {
            if metric != want {
                return Err(format!("{cg} {name}: metrics {metric:?}, status {want:?}"));
            }
        }
        let devices = r["devices"].as_array().unwrap();
        let used = find(m, "fgpu_cgroup_memory_used_bytes", &at);
        if used.len() != devices.len() {
            return Err(format!(
                "{cg}: {} device series, {} devices",
                used.len(),
                devices.len()
            ));
        }
        for d in devices {
            let gpu = d["device"].to_string();
            let v = find(
                m,
                "fgpu_cgroup_memory_used_bytes",
                &[("cgroup", cg), ("gpu", &gpu)],
            );
            if v.len() != 1 || Some(v[0].value) != d["memory_used_bytes"].as_f64() {
                return Err(format!("{cg} gpu {gpu}: metrics {v:?}, status {d}"));
            }
        }
    }
    let c = &detail["counters"];
    for (name, field) in [
        ("fgpu_events_dropped_total", "ringbuf_drops"),
        ("fgpu_unknown_frees_total", "unknown_frees"),
        ("fgpu_failed_calls_total", "failed_calls"),
        ("fgpu_kernel_over_limit_total", "over_limit"),
    ] {
        if Some(one(m, name, &[])) != c[field].as_f64() {
            return Err(format!("{name}: status {field} {}", c[field]));
        }
    }
    let libraries = detail["libraries"].as_array().unwrap().len() as f64;
    if one(m, "fgpu_probed_libraries", &[]) != libraries {
        return Err(format!("fgpu_probed_libraries: status {libraries}"));
    }
    Ok(())
}

#[test]
fn privileged_metrics_agree_with_status_pass_promtool_and_follow_cgroups() {
    if !privileged() {
        return;
    }
    let agent = Agent::start_with(&["--metrics", "127.0.0.1:0", "--log-format", "json"]);
    let addr = address_in_log(|| agent.log_text());
    let state = SimState::new();
    let a = Cgroup::new(&unique("fgpu-e2e-metrics-a"));
    let b = Cgroup::new(&unique("fgpu-e2e-metrics-b"));
    ok(&agent.cli(&[
        "limit",
        "set",
        &a.path,
        "--memory",
        "1GiB",
        "--compute",
        "40",
    ]));
    ok(&agent.cli(&["limit", "set", &b.path, "--memory", "2GiB"]));
    // 300 MiB of context overhead each: 2 x 256 MiB fit in 1 GiB, 6 in 2 GiB.
    let load_a = limited_load(&agent, &state, &a, 2);
    let load_b = limited_load(&agent, &state, &b, 6);
    for cg in [&a, &b] {
        agent.wait_for(cg, "two denials", Duration::from_secs(5), |s| {
            s.is_some_and(|s| s["alloc_denied"] == 2)
        });
    }

    // The scrape and the status agree, on a settled node (status unchanged across the scrape,
    // and the scrape's sample taken after the status was).
    let mut last = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let (text, series) = loop {
        let before = agent.status();
        std::thread::sleep(PUBLISH + Duration::from_millis(100));
        let (text, series) = scrape(&addr);
        let (after, detail) = (agent.status(), agent.detail());
        if before == after {
            match compare(&after, &detail, &series) {
                Ok(()) => break (text, series),
                Err(e) => last = e,
            }
        }
        assert!(
            Instant::now() < deadline,
            "the scrape never agreed with the status: {last}\n{text}"
        );
    };
    let uuid_of_gpu0 = find(&series, "fgpu_gpu_info", &[("gpu", "0")])[0].labels["UUID"].clone();
    assert!(uuid_of_gpu0.starts_with("GPU-"), "{text}");
    let row_a = &find(
        &series,
        "fgpu_cgroup_memory_used_bytes",
        &[("cgroup", &a.path)],
    )[0];
    assert_eq!(
        row_a.labels["UUID"], uuid_of_gpu0,
        "DCGM's labels on the cgroup series"
    );
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(row_a.labels["Hostname"], host.trim());
    assert_eq!(
        one(
            &series,
            "fgpu_cgroup_alloc_denied_reported_total",
            &[("cgroup", &a.path)]
        ),
        2.0
    );
    assert_eq!(
        one(
            &series,
            "fgpu_cgroup_compute_share_ratio",
            &[("cgroup", &a.path)]
        ),
        0.4
    );
    assert!(
        find(
            &series,
            "fgpu_cgroup_compute_share_ratio",
            &[("cgroup", &b.path)]
        )
        .is_empty()
    );
    assert!(one(&series, "fgpu_ledgers", &[]) >= 2.0, "{text}");
    assert_eq!(one(&series, "fgpu_shims_connected", &[]), 2.0, "{text}");
    assert_eq!(one(&series, "fgpu_agent_ready", &[]), 1.0);

    // The classic form as served passes promtool, with no lint.
    let (passed, lint) = promtool(&text);
    assert!(passed, "promtool check metrics:\n{lint}\n{text}");
    assert!(
        text.contains("# TYPE fgpu_cgroup_alloc_denied_reported_total counter\n"),
        "{text}"
    );
    assert!(text.contains("# TYPE fgpu_gpu_info gauge\n"), "{text}");
    // The OpenMetrics form has the same series (from the same sample when both are asked
    // within one publish interval; the node is settled, so a retry or two at most).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (om, om_series) = scrape_openmetrics(&addr);
        let (cl, cl_series) = scrape(&addr);
        if sample_set(&om_series) == sample_set(&cl_series) {
            assert!(om_series.len() >= 30, "{om}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the two formats differ:\n{om}\n{cl}"
        );
    }
    // What a client asks for is what it gets, HEAD included; curl's `*/*` gets classic.
    for (accept, want) in [
        ("*/*", CLASSIC_TYPE),
        (CLASSIC_ACCEPT, CLASSIC_TYPE),
        ("text/plain", CLASSIC_TYPE),
        (PROMETHEUS_ACCEPT, OPENMETRICS_TYPE),
        ("application/openmetrics-text", OPENMETRICS_TYPE),
    ] {
        for method in ["GET", "HEAD"] {
            let r = request_with(
                &addr,
                method,
                "/metrics",
                &[("Accept", accept), ("User-Agent", "curl/8.5.0")],
            );
            assert_eq!(r.code, 200, "{method} {accept}: {}", r.body);
            assert_eq!(r.header("content-type"), Some(want), "{method} {accept}");
            let eof = r.body.ends_with("# EOF\n");
            match method {
                "HEAD" => assert!(r.body.is_empty(), "HEAD has no body: {}", r.body),
                _ => assert_eq!(eof, want == OPENMETRICS_TYPE, "{accept}: {}", r.body),
            }
        }
    }

    // b's container ends and its cgroup goes: once the status no longer has it, its series
    // are gone from the next sample on.
    let b_path = b.path.clone();
    assert!(load_b.finish().success());
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(10);
    let t0 = loop {
        let s = agent.status();
        if !s
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["cgroup"] == b_path.as_str())
        {
            break Instant::now();
        }
        assert!(Instant::now() < deadline, "b never left the status");
        std::thread::sleep(Duration::from_millis(10));
    };
    let gone_after = loop {
        let (text, _) = scrape(&addr);
        if !text.contains(&b_path) {
            break t0.elapsed();
        }
        assert!(
            t0.elapsed() < PUBLISH * 3,
            "b's series are still there {:?} after it left the status:\n{text}",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        gone_after <= PUBLISH + Duration::from_millis(300),
        "b's series outlived one publish interval: {gone_after:?}"
    );
    assert!(scrape(&addr).0.contains(&a.path), "a is still there");

    // The JSON log has the limit changes and the denials as events.
    let events: Vec<Value> = agent
        .log_text()
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}"))
        })
        .collect();
    let event = |kind: &str, cg: &str| {
        events
            .iter()
            .find(|e| e["fields"]["event"] == kind && e["fields"]["cgroup"] == cg)
            .cloned()
    };
    let set = event("limit_set", &a.path).expect("a limit_set event");
    assert_eq!(set["level"], "INFO", "{set}");
    assert_eq!(set["fields"]["memory_bytes"], 1u64 << 30, "{set}");
    assert_eq!(set["fields"]["compute_pct"], 40, "{set}");
    let denied = event("alloc_denied", &a.path).expect("an alloc_denied event");
    assert_eq!(denied["fields"]["limit_bytes"], 1u64 << 30, "{denied}");
    assert!(
        denied["fields"]["denied_total"]
            .as_u64()
            .is_some_and(|n| (1..=2).contains(&n)),
        "{denied}"
    );
    let total: u64 = events
        .iter()
        .filter(|e| {
            e["fields"]["event"] == "alloc_denied" && e["fields"]["cgroup"] == a.path.as_str()
        })
        .map(|e| e["fields"]["denied"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 2, "every denial is in exactly one event line");
    assert!(load_a.finish().success());
}

/// The agent started by hand (not waited for), so that its listener can be asked before the
/// probes are attached.
struct Starting {
    child: std::process::Child,
    log: std::path::PathBuf,
    dir: std::path::PathBuf,
    bpf: std::path::PathBuf,
}

impl Drop for Starting {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill on our own, unreaped child's pid.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_dir_all(&self.bpf);
    }
}

#[test]
fn privileged_readyz_is_not_ready_before_the_probes_attach_and_the_listener_is_bounded() {
    if !privileged() {
        return;
    }
    let name = unique("fgpu-e2e-ready");
    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("agent.log");
    let bpf = std::path::Path::new("/sys/fs/bpf").join(&name);
    let child = Command::new(env!("CARGO_BIN_EXE_fgpu"))
        .args([
            "agent",
            "--sim",
            "--metrics",
            "127.0.0.1:0",
            "--admin-socket",
        ])
        .arg(dir.join("admin/fgpu.sock"))
        .arg("--socket")
        .arg(dir.join("containers/fgpu.sock"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--bpf-dir")
        .arg(&bpf)
        .env("FGPU_SIM_DIR", sim_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let agent = Starting {
        child,
        log: log.clone(),
        dir,
        bpf,
    };
    let text = || std::fs::read_to_string(&agent.log).unwrap_or_default();
    let addr = address_in_log(text);
    // The listener is up before the eBPF object is loaded and attached (hundreds of ms).
    let first = get(&addr, "/readyz");
    assert_ne!(
        first.code,
        200,
        "ready at the first ask: the probes attached before it, the test cannot tell\n{}",
        text()
    );
    assert_eq!(first.code, 503, "{}", first.body);
    assert_eq!(first.body, "not ready: the probes are not attached yet\n");
    let live = get(&addr, "/healthz");
    assert_eq!((live.code, live.body.as_str()), (200, "starting\n"));
    assert_eq!(get(&addr, "/metrics").code, 503);

    let deadline = Instant::now() + Duration::from_secs(20);
    let ready = loop {
        let r = get(&addr, "/readyz");
        if r.code == 200 {
            break r;
        }
        assert!(r.body.starts_with("not ready: "), "{}", r.body);
        assert!(Instant::now() < deadline, "never ready:\n{}", text());
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(ready.body, "ready\n");
    assert!(
        text().contains("attached library"),
        "ready before the probes attached:\n{}",
        text()
    );
    // Liveness follows the agent loop's first beat (once a second), which may come just
    // after readiness: "starting" (still 200) until then, "ok" within a beat.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let h = get(&addr, "/healthz");
        assert_eq!(h.code, 200, "{}", h.body);
        if h.body == "ok\n" {
            break;
        }
        assert_eq!(h.body, "starting\n");
        assert!(
            Instant::now() < deadline,
            "no beat within 3 s of readiness:\n{}",
            text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // Misbehaving clients: other routes and methods, a head too large, a client that never
    // sends its request.
    assert_eq!(get(&addr, "/nope").code, 404);
    let post = metrics_http::request(&addr, "POST", "/metrics");
    assert_eq!((post.code, post.header("allow")), (405, Some("GET, HEAD")));
    let huge = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Filler: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let answer = metrics_http::raw(&addr, huge.as_bytes()).unwrap_or_default();
    assert!(
        answer.is_empty() || metrics_http::parse_response(&answer).code == 431,
        "an oversized head was served: {}",
        String::from_utf8_lossy(&answer)
    );
    // A peer that opens connections and never sends its request: it holds at most 4 (the
    // rest are refused at once), they are closed after the 3 s head timeout, and the node's
    // probe is answered meanwhile.
    let silent: Vec<std::net::TcpStream> = (0..20)
        .map(|_| metrics_http::connect_from([127, 0, 0, 2], &addr, true).unwrap())
        .collect();
    let t = Instant::now();
    let r = get(&addr, "/healthz");
    assert_eq!(r.code, 200);
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    let mut closed = 0;
    for mut s in silent {
        use std::io::Read;
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 256];
        // A refused one is told why first.
        let r = match s.read(&mut buf) {
            Ok(n) if n > 0 && buf.starts_with(b"HTTP/1.1 503") => s.read(&mut buf),
            other => other,
        };
        if matches!(&r, Ok(0))
            || r.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset)
        {
            closed += 1;
        }
    }
    assert_eq!(closed, 20, "silent connections are closed");
}

#[test]
fn privileged_compute_turns_and_switches_are_counted() {
    if !privileged() {
        return;
    }
    let agent = Agent::start_with(&["--metrics", "127.0.0.1:0"]);
    let addr = address_in_log(|| agent.log_text());
    let state = SimState::new();
    let a = Cgroup::new(&unique("fgpu-e2e-turns-a"));
    let b = Cgroup::new(&unique("fgpu-e2e-turns-b"));
    ok(&agent.cli(&["limit", "set", &a.path, "--compute", "30"]));
    ok(&agent.cli(&["limit", "set", &b.path, "--compute", "70"]));
    // Both saturate the one simulated device for 1.5 s: the controller passes turns.
    let work = ["launch-for", "1500", "sleep_1000us", "hold"];
    let mut la = Load::spawn_with_shim(&a, &state.0, &agent, &work);
    let mut lb = Load::spawn_with_shim(&b, &state.0, &agent, &work);
    la.expect_line("launch-for ok");
    lb.expect_line("launch-for ok");
    std::thread::sleep(PUBLISH + Duration::from_millis(100));
    let (text, series) = scrape(&addr);
    for cg in [&a, &b] {
        let turns = one(
            &series,
            "fgpu_ledger_compute_turns_total",
            &[("ledger", &cg.path), ("gpu", "0")],
        );
        assert!(turns >= 2.0, "{}: {turns} turns\n{text}", cg.path);
        let gpu_s = one(
            &series,
            "fgpu_ledger_gpu_time_seconds_total",
            &[("ledger", &cg.path), ("gpu", "0")],
        );
        assert!(
            gpu_s > 0.05 && gpu_s < 1.6,
            "{}: {gpu_s} s of GPU time\n{text}",
            cg.path
        );
        let share = one(
            &series,
            "fgpu_cgroup_compute_share_ratio",
            &[("cgroup", &cg.path)],
        );
        assert!(share == 0.3 || share == 0.7, "{share}");
    }
    let switches = one(
        &series,
        "fgpu_compute_switch_seconds_count",
        &[("gpu", "0")],
    );
    let sum = one(&series, "fgpu_compute_switch_seconds_sum", &[("gpu", "0")]);
    assert!(switches >= 2.0, "{switches} switches\n{text}");
    // Each switch waits at most the drain deadline (20 ms) and a few ticks.
    assert!(
        sum >= 0.0 && sum <= switches * 0.022,
        "{sum} s over {switches} switches"
    );
    let inf = one(
        &series,
        "fgpu_compute_switch_seconds_bucket",
        &[("gpu", "0"), ("le", "+Inf")],
    );
    assert_eq!(inf, switches);
    let turns = |cg: &Cgroup| {
        one(
            &series,
            "fgpu_ledger_compute_turns_total",
            &[("ledger", &cg.path)],
        )
    };
    eprintln!(
        "turns: a {} b {}; {switches} switches, mean {:.2} ms",
        turns(&a),
        turns(&b),
        1e3 * sum / switches
    );
    let (passed, lint) = promtool(&text);
    assert!(passed, "promtool check metrics:\n{lint}\n{text}");
    assert!(la.finish().success() && lb.finish().success());
}

/// The kubelet's probe timeout as the chart sets it (`timeoutSeconds: 1`).
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

#[test]
fn privileged_health_answers_within_a_second_while_peers_flood_the_listener() {
    if !privileged() {
        return;
    }
    let agent = Agent::start_with(&["--metrics", "127.0.0.1:0"]);
    let addr = address_in_log(|| agent.log_text());
    // The node (the kubelet's probes), a scraper and the hostile peers: addresses of their
    // own on loopback.
    const NODE: [u8; 4] = [127, 0, 0, 1];
    const SCRAPER: [u8; 4] = [127, 0, 0, 3];
    let deadline = Instant::now() + Duration::from_secs(20);
    while metrics_http::probe_from(NODE, &addr, "/readyz", PROBE_TIMEOUT).map(|(r, _)| r.code)
        != Ok(200)
    {
        assert!(
            Instant::now() < deadline,
            "never ready:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // One peer with 64 idle keep-alive connections and 16 half-sent requests; twenty more
    // with 4 + 4 each, so that the listener is full as well (240 wanted).
    let mut peers = vec![flood::Peer {
        src: [127, 0, 0, 2],
        idle: 64,
        half_sent: 16,
    }];
    peers.extend((10..30).map(|i| flood::Peer {
        src: [127, 0, 0, i],
        idle: 4,
        half_sent: 4,
    }));
    let flood = flood::start(&addr, &peers);
    // Let the flood take every place it can.
    std::thread::sleep(Duration::from_secs(2));
    let mut took = Vec::new();
    let mut failed = Vec::new();
    for round in 0..6 {
        for path in ["/healthz", "/readyz"] {
            match metrics_http::probe_from(NODE, &addr, path, PROBE_TIMEOUT) {
                Ok((r, t)) if r.code == 200 => took.push(t),
                Ok((r, t)) => failed.push(format!(
                    "round {round}: {path}: {} {:?} after {t:?}",
                    r.code, r.body
                )),
                Err(why) => failed.push(format!("round {round}: {path}: {why}")),
            }
        }
        // Another peer still gets the figures.
        match metrics_http::probe_from(SCRAPER, &addr, "/metrics", Duration::from_secs(2)) {
            Ok((r, _)) if r.code == 200 && r.body.contains("fgpu_") => {}
            Ok((r, t)) => failed.push(format!(
                "round {round}: /metrics: {} after {t:?}: {:.200}",
                r.code, r.body
            )),
            Err(why) => failed.push(format!("round {round}: /metrics: {why}")),
        }
        std::thread::sleep(Duration::from_millis(700));
    }
    let seen = flood.stop();
    eprintln!(
        "probes answered in at most {:?} ({} of 12); the flood: {seen:?}",
        took.iter().max(),
        took.len()
    );
    assert!(
        failed.is_empty(),
        "under the flood ({seen:?}):\n{}",
        failed.join("\n")
    );
    assert!(
        seen.refused > 0 && seen.closed > seen.refused,
        "the flood was neither refused nor closed: {seen:?}"
    );

    // A keep-alive connection idle after its answer is closed within a few seconds (3 s),
    // and a request head sent a byte at a time is cut off likewise.
    let mut idle = metrics_http::connect_from([127, 0, 0, 4], &addr, true).unwrap();
    let mut slow = metrics_http::connect_from([127, 0, 0, 5], &addr, true).unwrap();
    use std::io::{Read, Write};
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let t = Instant::now();
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = idle.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
    let closed = idle.read(&mut buf);
    assert!(
        matches!(closed, Ok(0)) && t.elapsed() < Duration::from_millis(4500),
        "an idle keep-alive connection: {closed:?} after {:?}",
        t.elapsed()
    );
    slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let t = Instant::now();
    let cut = loop {
        std::thread::sleep(Duration::from_millis(250));
        if slow.write_all(b"a").is_err() || t.elapsed() > Duration::from_secs(10) {
            break t.elapsed();
        }
    };
    assert!(
        cut < Duration::from_millis(4500),
        "a request head sent a byte at a time was still taken after {cut:?}"
    );
}
