//! Helpers of the metrics tests: a plain HTTP/1.1 client, the agent's metrics address from
//! its log, a parser of the samples of either exposition format, and promtool.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The address the agent's log says the metrics listener is on (waits up to 20 s).
pub fn address_in_log(log: impl Fn() -> String) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = log();
        if let Some(rest) = text.split("readyz on http://").nth(1) {
            let end = rest
                .find(|c: char| c.is_whitespace() || c == '"')
                .unwrap_or(rest.len());
            return rest[..end].to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no metrics address in the agent's log:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A response: status code, headers (lower-case names), body.
pub struct Response {
    pub code: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Sends `request` (raw bytes) and reads the whole response (the request asks to close).
pub fn raw(addr: &str, request: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(15)))?;
    s.write_all(request)?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    Ok(out)
}

pub fn request(addr: &str, method: &str, path: &str) -> Response {
    request_with(addr, method, path, &[])
}

/// A request with `headers` besides Host and Connection.
pub fn request_with(addr: &str, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str("\r\n");
    let bytes = raw(addr, req.as_bytes()).unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    parse_response(&bytes)
}

pub fn get(addr: &str, path: &str) -> Response {
    request(addr, "GET", path)
}

pub fn parse_response(bytes: &[u8]) -> Response {
    let text = String::from_utf8_lossy(bytes);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines.next().unwrap_or_default();
    let code = status
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Response {
        code,
        headers,
        body: body.to_string(),
    }
}

/// A plain scrape (no `Accept`, as `curl` without options): the classic text format.
pub fn scrape(addr: &str) -> (String, Vec<Series>) {
    let r = get(addr, "/metrics");
    assert_eq!(r.code, 200, "{}", r.body);
    assert_eq!(r.header("content-type"), Some(CLASSIC_TYPE));
    assert_eq!(r.header("vary"), Some("accept"));
    assert!(
        !r.body.contains("# EOF") && !r.body.contains("# UNIT"),
        "{}",
        r.body
    );
    assert!(r.body.ends_with('\n'), "not a whole exposition");
    let series = parse(&r.body);
    (r.body, series)
}

/// A scrape that asks for OpenMetrics as Prometheus 2.x does.
pub fn scrape_openmetrics(addr: &str) -> (String, Vec<Series>) {
    let r = request_with(addr, "GET", "/metrics", &[("Accept", PROMETHEUS_ACCEPT)]);
    assert_eq!(r.code, 200, "{}", r.body);
    assert_eq!(r.header("content-type"), Some(OPENMETRICS_TYPE));
    assert!(r.body.ends_with("# EOF\n"), "not a whole exposition");
    assert!(r.body.contains("# TYPE fgpu_gpu info\n"), "{}", r.body);
    let series = parse(&r.body);
    (r.body, series)
}

/// The samples of an exposition as comparable text (a value `2` and `2.0` alike).
pub fn sample_set(series: &[Series]) -> std::collections::BTreeSet<String> {
    series
        .iter()
        .map(|s| {
            // A bucket's bound is a number to a scraper: OpenMetrics writes `1.0`, the
            // classic format `1`.
            let labels: BTreeMap<&String, String> = s
                .labels
                .iter()
                .map(|(k, v)| match (k.as_str(), v.parse::<f64>()) {
                    ("le", Ok(b)) => (k, b.to_string()),
                    _ => (k, v.clone()),
                })
                .collect();
            format!("{} {:?} {}", s.name, labels, s.value)
        })
        .collect()
}

/// One sample line.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// What Prometheus 2.5 to 2.48 sends (Debian 12's 2.42 among them): OpenMetrics first.
pub const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
/// What Prometheus 2.49 and later sends with `scrape_protocols: [PrometheusText0.0.4]`.
pub const CLASSIC_ACCEPT: &str = "text/plain;version=0.0.4;q=0.6,*/*;q=0.5";
pub const OPENMETRICS_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const CLASSIC_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The samples of an exposition, OpenMetrics or classic (label values hold no `"` or `,`
/// here: the agent replaces quotes, and the tests' cgroup names have no commas).
pub fn parse(text: &str) -> Vec<Series> {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name, rest) = match line.find('{') {
            Some(i) => (&line[..i], &line[i + 1..]),
            None => {
                let (n, v) = line.split_once(' ').expect("name value");
                out.push(Series {
                    name: n.to_string(),
                    labels: BTreeMap::new(),
                    value: v.parse().expect("a number"),
                });
                continue;
            }
        };
        let (labels, value) = rest.rsplit_once("} ").expect("labels then value");
        let labels = labels
            .split("\",")
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once("=\"").expect("k=\"v\"");
                (k.to_string(), v.trim_end_matches('"').to_string())
            })
            .collect();
        out.push(Series {
            name: name.to_string(),
            labels,
            value: value.trim().parse().expect("a number"),
        });
    }
    out
}

/// The series named `name` whose labels include every one of `want`.
pub fn find<'a>(all: &'a [Series], name: &str, want: &[(&str, &str)]) -> Vec<&'a Series> {
    all.iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            want.iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect()
}

/// The one value of `name` with `want`; panics when there is none or several.
pub fn one(all: &[Series], name: &str, want: &[(&str, &str)]) -> f64 {
    let found = find(all, name, want);
    assert_eq!(found.len(), 1, "{name} {want:?}: {found:?}");
    found[0].value
}

/// `promtool check metrics` on `text` as it was served (the classic format: promtool 2.x
/// does not read OpenMetrics): its output, and whether it passed.
pub fn promtool(text: &str) -> (bool, String) {
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool is needed (Debian: apt-get install prometheus; .ci/run installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}
