//! Helpers of the metrics tests: a plain HTTP/1.1 client, the agent's metrics address from
//! its log, a parser of the samples of either exposition format, and promtool.
#![allow(dead_code)]

pub mod flood;

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

/// A TCP connection to `addr` (an IPv4 `ip:port`) from source address `src` (any of
/// 127.0.0.0/8 on loopback): another peer to the listener. With `wait`, connects as `connect`
/// does; without, returns at once with the connection under way (the socket non-blocking).
pub fn connect_from(src: [u8; 4], addr: &str, wait: bool) -> std::io::Result<TcpStream> {
    use std::os::fd::FromRawFd;
    let dest: std::net::SocketAddrV4 = addr.parse().expect("an IPv4 address and port");
    let sockaddr = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let kind = libc::SOCK_STREAM | libc::SOCK_CLOEXEC | if wait { 0 } else { libc::SOCK_NONBLOCK };
    // SAFETY: a plain socket(2); the descriptor is owned by the TcpStream made below (or
    // closed on error).
    let fd = unsafe { libc::socket(libc::AF_INET, kind, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a socket of ours that nothing else owns.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    let from = sockaddr(src.into(), 0);
    let to = sockaddr(*dest.ip(), dest.port());
    // SAFETY: bind(2) and connect(2) on our socket with valid sockaddr_in of `len` bytes.
    unsafe {
        if libc::bind(fd, (&raw const from).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::connect(fd, (&raw const to).cast(), len) != 0 {
            let err = std::io::Error::last_os_error();
            if wait || err.raw_os_error() != Some(libc::EINPROGRESS) {
                return Err(err);
            }
        }
    }
    Ok(stream)
}

/// `GET path` from source address `src`, as a kubelet probe does (a connection of its own,
/// `Connection: close`): the response and how long it took, or why there was none within
/// `limit` (connecting included).
pub fn probe_from(
    src: [u8; 4],
    addr: &str,
    path: &str,
    limit: Duration,
) -> Result<(Response, Duration), String> {
    let start = Instant::now();
    let left = |start: Instant| {
        limit
            .checked_sub(start.elapsed())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| format!("no answer within {limit:?}"))
    };
    // Connecting counts against the limit too: a listener that does not accept leaves the
    // connection in its backlog, and a full backlog drops it.
    let mut s = connect_from(src, addr, false).map_err(|e| format!("connect: {e}"))?;
    let mut fd = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(&s),
        events: libc::POLLOUT,
        revents: 0,
    };
    let ms = left(start)?.as_millis() as libc::c_int;
    // SAFETY: poll(2) on one valid pollfd of ours.
    if unsafe { libc::poll(&raw mut fd, 1, ms) } != 1 {
        return Err(format!("not connected within {limit:?}"));
    }
    if let Some(e) = s.take_error().map_err(|e| e.to_string())? {
        return Err(format!("connect: {e}"));
    }
    s.set_nonblocking(false).unwrap();
    s.set_write_timeout(Some(left(start)?)).unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .map_err(|e| format!("sending: {e}"))?;
    let mut out = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    loop {
        s.set_read_timeout(Some(left(start)?)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return Err(format!(
                    "no answer within {limit:?} ({} bytes of it)",
                    out.len()
                ));
            }
            Err(e) => return Err(format!("reading: {e} ({} bytes read)", out.len())),
        }
    }
    let took = start.elapsed();
    if took > limit {
        return Err(format!("answered after {took:?}, past {limit:?}"));
    }
    if out.is_empty() {
        return Err("closed without an answer".into());
    }
    Ok((parse_response(&out), took))
}
