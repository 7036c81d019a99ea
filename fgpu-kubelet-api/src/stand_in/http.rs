//! The few HTTP calls the stand-in kubelet makes to an API server, as plain HTTP/1.1 over std
//! TCP: to a `kubectl proxy` or the end-to-end tests' stand-in API server, on `http://`
//! only (no TLS, no credentials: a kubelet's own client has both).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// An answer: the status code and the body (JSON from an API server).
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

/// `http://HOST:PORT[/PREFIX]` as (HOST:PORT, PREFIX without its trailing '/').
pub fn parse_url(url: &str) -> Result<(String, String), String> {
    let Some(rest) = url.strip_prefix("http://") else {
        return Err(format!(
            "{url}: give a plain http:// URL (a `kubectl proxy`, or a stand-in API server); https is not spoken here"
        ));
    };
    let (authority, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if authority.is_empty() {
        return Err(format!("{url}: no host"));
    }
    let authority = if authority.contains(':') && !authority.ends_with(']') {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let prefix = prefix.trim_end_matches('/');
    let prefix = if prefix.is_empty() {
        String::new()
    } else {
        format!("/{prefix}")
    };
    Ok((authority, prefix))
}

/// Go's `url.QueryEscape`, for a query parameter's value.
pub fn query_escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// `METHOD` of `path` (with its query) on the API server at `url`, without a body.
pub fn call(url: &str, method: &str, path: &str, timeout: Duration) -> Result<Response, String> {
    let (authority, prefix) = parse_url(url)?;
    let addr = authority
        .to_socket_addrs()
        .map_err(|e| format!("{url}: {e}"))?
        .next()
        .ok_or_else(|| format!("{url}: no address"))?;
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("{url}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .and_then(|()| s.set_write_timeout(Some(timeout)))
        .map_err(|e| format!("{url}: {e}"))?;
    write!(
        s,
        "{method} {prefix}{path} HTTP/1.1\r\nHost: {authority}\r\nAccept: application/json\r\n\
         User-Agent: fgpu-test-kubelet\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("{url}: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .map_err(|e| format!("{method} {url}{prefix}{path}: {e}"))?;
    parse_response(&raw).map_err(|e| format!("{method} {url}{prefix}{path}: {e}"))
}

fn parse_response(raw: &[u8]) -> Result<Response, String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no complete HTTP answer")?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or("not an HTTP answer")?;
    let mut chunked = false;
    let mut length = None;
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            let v = v.trim();
            if k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked") {
                chunked = true;
            } else if k.eq_ignore_ascii_case("content-length") {
                length = v.parse::<usize>().ok();
            }
        }
    }
    let mut body = &raw[end + 4..];
    let decoded;
    if chunked {
        decoded = dechunk(body)?;
        body = &decoded;
    } else if let Some(n) = length {
        body = body
            .get(..n)
            .ok_or("the answer is shorter than its Content-Length")?;
    }
    Ok(Response {
        status,
        body: String::from_utf8_lossy(body).into_owned(),
    })
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("a cut chunked answer")?;
        let size = String::from_utf8_lossy(&b[..eol]);
        let size = size.split(';').next().unwrap_or("").trim();
        let n = usize::from_str_radix(size, 16).map_err(|_| "a bad chunk size")?;
        b = &b[eol + 2..];
        if n == 0 {
            return Ok(out);
        }
        out.extend_from_slice(b.get(..n).ok_or("a cut chunk")?);
        b = b.get(n + 2..).ok_or("a cut chunk")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_queries_and_answers() {
        assert_eq!(
            parse_url("http://127.0.0.1:8001").unwrap(),
            ("127.0.0.1:8001".into(), String::new())
        );
        assert_eq!(
            parse_url("http://proxy/k8s/").unwrap(),
            ("proxy:80".into(), "/k8s".into())
        );
        assert!(
            parse_url("https://10.0.0.1:6443")
                .unwrap_err()
                .contains("plain http")
        );
        assert_eq!(
            query_escape("spec.nodeName=node-1"),
            "spec.nodeName%3Dnode-1"
        );
        let r = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}").unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "{}"));
        let r = parse_response(
            b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((r.status, r.body.as_str()), (404, "{\"a\":1}"));
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n").is_err());
    }
}
