//! The smallest honest stand-in for the API server: an HTTP/1.1 server on loopback that
//! serves recorded objects by path (GET), records what is applied (PATCH) and answers the
//! rest with a Kubernetes `Status` 404. kube-rs talks to it as to a real one (same paths,
//! same JSON); what it does not check is in docs/kubernetes.md.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Shared {
    objects: HashMap<String, String>,
    patches: Vec<(String, String)>,
    gets: Vec<String>,
}

pub struct ApiServer {
    pub url: String,
    shared: Arc<Mutex<Shared>>,
}

impl ApiServer {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(Mutex::new(Shared::default()));
        let s = shared.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let s = s.clone();
                std::thread::spawn(move || serve(stream, &s));
            }
        });
        Self { url, shared }
    }

    /// Serves `json` at `path` (e.g. /apis/resource.k8s.io/v1/namespaces/NS/resourceclaims/N).
    pub fn put(&self, path: &str, json: &str) {
        self.shared
            .lock()
            .unwrap()
            .objects
            .insert(path.to_string(), json.to_string());
    }

    pub fn remove(&self, path: &str) {
        self.shared.lock().unwrap().objects.remove(path);
    }

    /// (path with query, body) of every PATCH so far.
    pub fn patches(&self) -> Vec<(String, String)> {
        self.shared.lock().unwrap().patches.clone()
    }

    /// The paths of every GET so far.
    pub fn gets(&self) -> Vec<String> {
        self.shared.lock().unwrap().gets.clone()
    }
}

fn serve(stream: std::net::TcpStream, shared: &Mutex<Shared>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let mut length = 0usize;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    let _ = reader.read_exact(&mut body);
    let body = String::from_utf8_lossy(&body).into_owned();
    let path = target.split('?').next().unwrap_or("").to_string();
    let (code, answer) = {
        let mut s = shared.lock().unwrap();
        match method.as_str() {
            "GET" => {
                s.gets.push(path.clone());
                match s.objects.get(&path) {
                    Some(o) => (200, o.clone()),
                    None => (404, not_found(&path)),
                }
            }
            "PATCH" => {
                s.patches.push((target.clone(), body.clone()));
                (200, body)
            }
            _ => (404, not_found(&path)),
        }
    };
    let reason = if code == 200 { "OK" } else { "Not Found" };
    let mut out = stream;
    let _ = write!(
        out,
        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
        answer.len()
    );
}

fn not_found(path: &str) -> String {
    format!(
        r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":"{path} not found","reason":"NotFound","code":404}}"#
    )
}
