use super::families::{LedgerDevice, Sample, exported_names};
use super::negotiate::Format;
use crate::agent::gpus::Gpu;
use crate::status::{CgroupStatus, DeviceUsage, StatusReport};

/// The OpenMetrics exposition of `s`.
fn encode(s: &Sample) -> String {
    super::families::encode(s, Format::OpenMetrics)
}

const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn gpu(index: u32) -> Gpu {
    Gpu {
        index,
        uuid: format!("GPU-0000000{index}-1111-2222-3333-444444444444"),
        name: "Simulated H200".into(),
        memory_total_bytes: 141 << 30,
    }
}

fn row(cgroup: &str, used: u64, limit: Option<u64>, denied: u64) -> CgroupStatus {
    CgroupStatus {
        cgroup_id: 7,
        pids: vec![10, 11],
        memory_used_bytes: used,
        memory_limit_bytes: limit,
        alloc_denied: denied,
        over_limit_actions: 2,
        devices: vec![DeviceUsage {
            device: 1,
            uuid: None,
            memory_used_bytes: used,
            limit_bytes: None,
            allocs: 5,
            frees: 1,
        }],
        compute_share_pct: Some(30),
        compute_used_pct: Some(27.5),
        compute_turn_pct: Some(31.0),
        compute_queue_us: Some(8000),
        ..CgroupStatus::empty(cgroup.into())
    }
}

fn sample(rows: Vec<CgroupStatus>) -> Sample {
    Sample {
        hostname: "node-1".into(),
        report: StatusReport {
            cgroups: rows,
            libraries: vec!["/usr/lib/libcuda.so.1".into()],
            ..StatusReport::default()
        },
        gpus: vec![gpu(0), gpu(1)],
        ledgers: 1,
        shims: 3,
        ledger_devices: vec![LedgerDevice {
            ledger: "/fgpu/a".into(),
            gpu: 1,
            turns: 42,
            gpu_time_s: 1.5,
        }],
        switches: vec![(1, {
            let mut g = crate::agent::compute::Gaps::new(&[0.001, 0.01]);
            g.observe(0.004);
            g
        })],
        park: {
            let mut p = crate::agent::park::Figures::default();
            p.per_cgroup.insert(
                "/fgpu/a".into(),
                crate::agent::park::CgroupFigures {
                    parks: 2,
                    unparks: 1,
                    parked_bytes: 3 << 30,
                    wait_s: 0.5,
                },
            );
            p.park.observe(3.5);
            p.unpark.observe(0.9);
            p
        },
        ready: true,
    }
}

#[test]
fn parking_has_its_counters_per_cgroup_and_its_durations_per_node() {
    let mut parked = row("/fgpu/a", 0, Some(4 << 30), 0);
    parked.parked_bytes = 3 << 30;
    let text = encode(&sample(vec![parked]));
    let base = r#"cgroup="/fgpu/a",Hostname="node-1""#;
    for want in [
        format!("fgpu_cgroup_parked_bytes{{{base}}} 3221225472.0"),
        format!("fgpu_cgroup_parks_total{{{base}}} 2.0"),
        format!("fgpu_cgroup_unparks_total{{{base}}} 1.0"),
        format!("fgpu_cgroup_park_moved_bytes_total{{{base}}} 3221225472.0"),
        format!("fgpu_cgroup_park_wait_seconds_total{{{base}}} 0.5"),
        r#"fgpu_park_duration_seconds_bucket{le="4.0",Hostname="node-1"} 1"#.to_string(),
        r#"fgpu_park_duration_seconds_bucket{le="2.0",Hostname="node-1"} 0"#.to_string(),
        r#"fgpu_unpark_duration_seconds_bucket{le="1.0",Hostname="node-1"} 1"#.to_string(),
        r#"fgpu_unpark_duration_seconds_count{Hostname="node-1"} 1"#.to_string(),
    ] {
        assert!(
            series(&text).contains(&want.as_str()),
            "missing {want} in\n{text}"
        );
    }
    // The classic format carries the same.
    let c = classic(&sample(vec![row("/fgpu/a", 0, None, 0)]));
    assert!(
        c.contains("# TYPE fgpu_park_duration_seconds histogram"),
        "{c}"
    );
    assert!(c.contains("fgpu_cgroup_parks_total{"), "{c}");
}

/// The sample lines (not comments) of an exposition.
fn series(text: &str) -> Vec<&str> {
    text.lines().filter(|l| !l.starts_with('#')).collect()
}

#[test]
fn a_cgroup_has_its_figures_with_dcgm_and_container_labels() {
    let path = format!("/system.slice/docker-{ID}.scope");
    let text = encode(&sample(vec![row(&path, 3 << 30, Some(4 << 30), 9)]));
    assert!(text.ends_with("# EOF\n"), "{text}");
    let uuid = "GPU-00000001-1111-2222-3333-444444444444";
    let base = format!(r#"cgroup="{path}",container_id="{ID}",Hostname="node-1""#);
    for want in [
        format!(r#"fgpu_cgroup_memory_used_bytes{{{base},gpu="1",UUID="{uuid}"}} 3221225472.0"#),
        format!("fgpu_cgroup_memory_limit_bytes{{{base}}} 4294967296.0"),
        format!("fgpu_cgroup_alloc_denied_reported_total{{{base}}} 9.0"),
        format!("fgpu_cgroup_backstop_actions_total{{{base}}} 2.0"),
        format!("fgpu_cgroup_processes{{{base}}} 2.0"),
        format!("fgpu_cgroup_compute_share_ratio{{{base}}} 0.3"),
        format!("fgpu_cgroup_compute_used_ratio{{{base}}} 0.275"),
        format!("fgpu_cgroup_compute_turn_ratio{{{base}}} 0.31"),
        format!("fgpu_cgroup_compute_queue_seconds{{{base}}} 0.008"),
        format!(
            r#"fgpu_ledger_compute_turns_total{{ledger="/fgpu/a",gpu="1",UUID="{uuid}",Hostname="node-1"}} 42.0"#
        ),
        r#"fgpu_shims_connected{Hostname="node-1"} 3.0"#.to_string(),
        format!(r#"fgpu_compute_switch_seconds_bucket{{le="0.01",gpu="1",UUID="{uuid}",Hostname="node-1"}} 1"#),
        format!(r#"fgpu_compute_switch_seconds_count{{gpu="1",UUID="{uuid}",Hostname="node-1"}} 1"#),
        r#"fgpu_probed_libraries{Hostname="node-1"} 1.0"#.to_string(),
        r#"fgpu_untracked_allocations_total{Hostname="node-1",reason="map_full"} 0.0"#.to_string(),
        r#"fgpu_gpu_info{gpu="0",UUID="GPU-00000000-1111-2222-3333-444444444444",model_name="Simulated H200",Hostname="node-1"} 1"#
            .to_string(),
    ] {
        assert!(
            series(&text).contains(&want.as_str()),
            "missing {want} in\n{text}"
        );
    }
    // No cap, so no cap series.
    assert!(!text.contains("fgpu_cgroup_compute_cap_ratio{"), "{text}");
}

#[test]
fn a_cgroup_gone_from_the_report_has_no_series() {
    let both = encode(&sample(vec![
        row("/fgpu/a", 1, None, 0),
        row("/fgpu/b", 2, None, 0),
    ]));
    assert!(both.contains(r#"cgroup="/fgpu/b""#));
    let one = encode(&sample(vec![row("/fgpu/a", 1, None, 0)]));
    assert!(one.contains(r#"cgroup="/fgpu/a""#));
    assert!(!one.contains("/fgpu/b"), "{one}");
    // Every family is still described.
    assert_eq!(
        both.lines().filter(|l| l.starts_with("# TYPE")).count(),
        one.lines().filter(|l| l.starts_with("# TYPE")).count()
    );
}

#[test]
fn hostile_cgroup_names_cannot_forge_series() {
    let evil = "/fgpu/x\"} 1\nfgpu_cgroup_alloc_denied_reported_total{cgroup=\"/victim\"} 999\n#";
    let text = encode(&sample(vec![row(evil, 1, None, 0)]));
    assert!(!text.contains("999\n"), "{text}");
    for line in series(&text) {
        assert!(line.starts_with("fgpu_") || line.is_empty(), "{line:?}");
    }
}

#[test]
fn the_names_come_from_the_registry() {
    let names = exported_names();
    for n in [
        "fgpu_cgroup_memory_used_bytes",
        "fgpu_cgroup_memory_limit_bytes",
        "fgpu_cgroup_alloc_denied_reported_total",
        "fgpu_cgroup_backstop_actions_total",
        "fgpu_events_dropped_total",
        "fgpu_gpu_info",
        "fgpu_ledger_gpu_time_seconds_total",
        "fgpu_compute_switch_seconds_bucket",
        "fgpu_compute_switch_seconds_count",
    ] {
        assert!(names.iter().any(|x| x == n), "{n} not in {names:?}");
    }
    assert!(!names.iter().any(|x| x == "fgpu_nonexistent"));
}

/// deploy/grafana/fgpu-dashboard.json is valid JSON, a Grafana dashboard, and every metric
/// its queries name is one the agent exports.
#[test]
fn the_dashboard_uses_only_exported_metrics() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/grafana/fgpu-dashboard.json"
    );
    let text = std::fs::read_to_string(path).expect("reading the dashboard");
    let dash: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is not JSON");
    assert!(
        dash["title"].is_string() && dash["panels"].is_array(),
        "not a dashboard"
    );
    let mut exprs = Vec::new();
    collect_exprs(&dash, &mut exprs);
    assert!(exprs.len() >= 6, "too few queries: {exprs:?}");
    let names = exported_names();
    let mut used = std::collections::BTreeSet::new();
    for e in &exprs {
        let found = metric_names(e);
        assert!(!found.is_empty(), "a query names no fgpu metric: {e}");
        for n in found {
            assert!(
                names.contains(&n),
                "the dashboard uses {n}, which the agent does not export ({e})"
            );
            used.insert(n);
        }
    }
    assert!(used.len() >= 8, "the dashboard shows few metrics: {used:?}");
}

fn collect_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                if (k == "expr" || k == "definition") && v.is_string() {
                    out.push(v.as_str().unwrap_or_default().to_string());
                } else {
                    collect_exprs(v, out);
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

/// The `fgpu_...` identifiers of a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
        if expr[i..].starts_with("fgpu_") && (i == 0 || !ident(b[i - 1])) {
            let start = i;
            while i < b.len() && ident(b[i]) {
                i += 1;
            }
            out.push(expr[start..i].to_string());
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn per_gpu_limits_and_shares_are_series_per_gpu() {
    let path = "/team/job";
    let (u0, u1) = (gpu(0).uuid, gpu(1).uuid);
    let mut r = row(path, 1 << 30, None, 0);
    r.memory_limit_gpus = [(u1.clone(), 1 << 30)].into();
    r.devices = vec![
        DeviceUsage {
            device: 0,
            uuid: Some(u0.clone()),
            memory_used_bytes: 0,
            limit_bytes: None,
            allocs: 0,
            frees: 0,
        },
        DeviceUsage {
            device: 1,
            uuid: Some(u1.clone()),
            memory_used_bytes: 1 << 30,
            limit_bytes: Some(1 << 30),
            allocs: 1,
            frees: 0,
        },
    ];
    r.compute_share_pct = None;
    r.compute_share_gpus = [(u1.clone(), 30)].into();
    let text = encode(&sample(vec![r]));
    let base = format!(r#"cgroup="{path}",Hostname="node-1""#);
    let on = |i: u32, u: &str| format!(r#"{base},gpu="{i}",UUID="{u}""#);
    for want in [
        format!(
            "fgpu_cgroup_memory_limit_bytes{{{}}} 1073741824.0",
            on(1, &u1)
        ),
        format!("fgpu_cgroup_compute_share_ratio{{{}}} 0.3", on(1, &u1)),
    ] {
        assert!(
            series(&text).contains(&want.as_str()),
            "missing {want} in\n{text}"
        );
    }
    // No limit and no share on GPU 0, and no series without a GPU for either.
    for absent in [
        format!("fgpu_cgroup_memory_limit_bytes{{{}}}", on(0, &u0)),
        format!("fgpu_cgroup_memory_limit_bytes{{{base}}}"),
        format!("fgpu_cgroup_compute_share_ratio{{{}}}", on(0, &u0)),
        format!("fgpu_cgroup_compute_share_ratio{{{base}}}"),
    ] {
        assert!(
            !series(&text).iter().any(|l| l.starts_with(&absent)),
            "unexpected {absent} in\n{text}"
        );
    }
}

/// The classic text (0.0.4) exposition of `s`.
fn classic(s: &Sample) -> String {
    super::families::encode(s, Format::Classic)
}

/// One sample: name, labels (sorted), value.
type Sampled = (String, Vec<(String, String)>, String);

/// Every sample of an exposition as (name, labels sorted, value), `le` read as a number (the
/// encoders write bounds their own way: `0.0005` or `5e-4`).
fn samples(text: &str) -> std::collections::BTreeSet<Sampled> {
    series(text)
        .into_iter()
        .filter(|l| !l.is_empty())
        .map(|line| {
            let (head, value) = line.rsplit_once(' ').expect("name value");
            let (name, labels) = match head.split_once('{') {
                Some((n, rest)) => (n, rest.strip_suffix('}').expect("}")),
                None => (head, ""),
            };
            let mut labels: Vec<(String, String)> = labels
                .split("\",")
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once("=\"").expect("k=\"v\"");
                    let v = v.trim_end_matches('"');
                    let v = match (k, v.parse::<f64>()) {
                        ("le", Ok(b)) => b.to_string(),
                        _ => v.to_string(),
                    };
                    (k.to_string(), v)
                })
                .collect();
            labels.sort();
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("a number: {line}"));
            (name.to_string(), labels, value.to_string())
        })
        .collect()
}

/// `# TYPE` lines: (name, type).
fn types(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|r| {
            let (n, t) = r.split_once(' ').expect("# TYPE name type");
            (n.to_string(), t.to_string())
        })
        .collect()
}

#[test]
fn the_classic_format_names_counters_and_infos_as_text_0_0_4_does() {
    let path = "/fgpu/a";
    let text = classic(&sample(vec![row(path, 3 << 30, Some(4 << 30), 9)]));
    let base = format!(r#"cgroup="{path}",Hostname="node-1""#);
    let uuid = "GPU-00000001-1111-2222-3333-444444444444";
    let lines: Vec<&str> = text.lines().collect();
    for want in [
        "# TYPE fgpu_cgroup_alloc_denied_reported_total counter".to_string(),
        "# HELP fgpu_cgroup_alloc_denied_reported_total Allocations the cgroup's shims report they refused at its limit: the tenant's own count, written in its usage page, not checked by the agent".to_string(),
        format!("fgpu_cgroup_alloc_denied_reported_total{{{base}}} 9"),
        "# TYPE fgpu_ledger_gpu_time_seconds_total counter".to_string(),
        format!(r#"fgpu_ledger_gpu_time_seconds_total{{ledger="/fgpu/a",gpu="1",UUID="{uuid}",Hostname="node-1"}} 1.5"#),
        "# TYPE fgpu_cgroup_memory_used_bytes gauge".to_string(),
        format!(r#"fgpu_cgroup_memory_used_bytes{{{base},gpu="1",UUID="{uuid}"}} 3221225472"#),
        "# TYPE fgpu_gpu_info gauge".to_string(),
        r#"fgpu_gpu_info{gpu="0",UUID="GPU-00000000-1111-2222-3333-444444444444",model_name="Simulated H200",Hostname="node-1"} 1"#.to_string(),
        "# TYPE fgpu_compute_switch_seconds histogram".to_string(),
        format!(r#"fgpu_compute_switch_seconds_bucket{{gpu="1",UUID="{uuid}",Hostname="node-1",le="0.001"}} 0"#),
        format!(r#"fgpu_compute_switch_seconds_bucket{{gpu="1",UUID="{uuid}",Hostname="node-1",le="0.01"}} 1"#),
        format!(r#"fgpu_compute_switch_seconds_bucket{{gpu="1",UUID="{uuid}",Hostname="node-1",le="+Inf"}} 1"#),
        format!(r#"fgpu_compute_switch_seconds_sum{{gpu="1",UUID="{uuid}",Hostname="node-1"}} 0.004"#),
        format!(r#"fgpu_compute_switch_seconds_count{{gpu="1",UUID="{uuid}",Hostname="node-1"}} 1"#),
    ] {
        assert!(lines.contains(&want.as_str()), "missing {want} in\n{text}");
    }
    for absent in [
        "# EOF",
        "# UNIT",
        "_created",
        "# TYPE fgpu_cgroup_alloc_denied_reported counter",
    ] {
        assert!(!text.contains(absent), "{absent} in\n{text}");
    }
    // A family without series is left out: no cap here.
    assert!(!text.contains("fgpu_cgroup_compute_cap_ratio"), "{text}");
    // Each family once, and every sample named by its family (histograms: _bucket, _sum,
    // _count), right after its descriptor.
    let mut family = String::new();
    let mut seen = std::collections::BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            family = rest.split(' ').next().unwrap().to_string();
            assert!(seen.insert(family.clone()), "{family} twice");
        } else if !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().unwrap();
            let ok = name == family
                || ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|s| name.strip_suffix(s) == Some(family.as_str()));
            assert!(ok, "{name} under {family}");
        }
    }
}

#[test]
fn both_formats_carry_the_same_series_and_families() {
    let mut r = row(
        &format!("/system.slice/docker-{ID}.scope"),
        1 << 30,
        None,
        2,
    );
    r.compute_cap_pct = Some(50);
    let s = sample(vec![r, row("/fgpu/b", 5, Some(9), 0)]);
    let (om, cl) = (encode(&s), classic(&s));
    assert!(om.ends_with("# EOF\n") && !cl.contains("# EOF"));
    let (a, b) = (samples(&om), samples(&cl));
    assert!(a.len() > 40, "{om}");
    assert_eq!(a, b, "\nOpenMetrics:\n{om}\nclassic:\n{cl}");
    // Histograms nothing was observed in yet (an agent that never parked) too.
    let mut quiet = s.clone();
    quiet.park = crate::agent::park::Figures::default();
    let (qo, qc) = (encode(&quiet), classic(&quiet));
    assert_eq!(
        samples(&qo),
        samples(&qc),
        "\nOpenMetrics:\n{qo}\nclassic:\n{qc}"
    );
    // Every OpenMetrics family with series is a classic family, named as its samples are.
    let classic_types = types(&cl);
    for (name, ty) in types(&om) {
        let (want, want_ty) = match ty.as_str() {
            "counter" => (format!("{name}_total"), "counter"),
            "info" => (format!("{name}_info"), "gauge"),
            t => (name.clone(), t),
        };
        let has_series = a.iter().any(|(n, _, _)| n.starts_with(&name));
        let found = classic_types.contains(&(want.clone(), want_ty.to_string()));
        assert_eq!(found, has_series, "{name} ({ty}) -> {want} {want_ty}\n{cl}");
    }
}

#[test]
fn hostile_cgroup_names_cannot_forge_classic_series() {
    let evil = "/fgpu/x\"} 1\nfgpu_cgroup_alloc_denied_reported_total{cgroup=\"/victim\"} 999\n#";
    let text = classic(&sample(vec![row(evil, 1, None, 0)]));
    assert!(!text.contains("999\n"), "{text}");
    for line in series(&text) {
        assert!(line.starts_with("fgpu_"), "{line:?}");
    }
}
