//! The smallest honest stand-in for the API server: an HTTP/1.1 server on loopback that
//! serves recorded objects by path (GET), records and stores what is applied (PATCH),
//! deletes (DELETE; on the ResourceSlice collection, those its field selector picks, as a
//! kubelet's start asks: `delete_slices`) and answers the rest with a Kubernetes `Status`
//! 404. A ResourceSlice is
//! validated before it is stored, as the real server does (`super::validate`), and refused
//! with a 422 `Invalid` Status carrying the upstream messages. kube-rs talks to it as to a
//! real one (same paths, same JSON); what it does not check is in docs/kubernetes.md.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Shared {
    objects: HashMap<String, String>,
    patches: Vec<(String, String)>,
    gets: Vec<String>,
    /// The target (path and query) of every DELETE so far.
    deletes: Vec<String>,
    /// PATCHes refused so far (validation), with the Status message.
    refused: Vec<(String, String)>,
    /// The next this many PATCHes fail with a 500 (an API server that is not ready yet).
    fail_patches: usize,
    /// Drop the consumable-capacity fields of ResourceSlices on write, as an API server with
    /// the DRAConsumableCapacity feature gate off does (pkg/registry/resource/resourceslice
    /// strategy.go, `dropDisabledFields`).
    drop_consumable_capacity: bool,
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

    /// The path and query of every DELETE so far.
    pub fn deletes(&self) -> Vec<String> {
        self.shared.lock().unwrap().deletes.clone()
    }

    /// (path, message) of every PATCH refused as invalid.
    pub fn refused(&self) -> Vec<(String, String)> {
        self.shared.lock().unwrap().refused.clone()
    }

    /// The object stored at `path`, if any.
    pub fn get(&self, path: &str) -> Option<String> {
        self.shared.lock().unwrap().objects.get(path).cloned()
    }

    /// Stores ResourceSlices without their consumable-capacity fields from now on.
    pub fn without_consumable_capacity(&self) {
        self.shared.lock().unwrap().drop_consumable_capacity = true;
    }

    /// Fails the next `n` PATCHes with a 500.
    pub fn fail_patches(&self, n: usize) {
        self.shared.lock().unwrap().fail_patches = n;
    }
}

/// PATCH (server-side apply) at `path`: a ResourceSlice is validated first.
fn apply(s: &mut Shared, target: &str, path: &str, body: &str) -> (u16, String) {
    if s.fail_patches > 0 {
        s.fail_patches -= 1;
        return (500, status(500, "InternalError", "the server is not ready"));
    }
    if let Some(name) = path.strip_prefix("/apis/resource.k8s.io/v1/resourceslices/") {
        let errs = match serde_json::from_str::<serde_json::Value>(body) {
            Ok(v) => super::validate::resource_slice(&v),
            Err(e) => vec![format!("the body is not JSON: {e}")],
        };
        if !errs.is_empty() {
            let msg = format!(
                "ResourceSlice.resource.k8s.io \"{name}\" is invalid: [{}]",
                errs.join(", ")
            );
            s.refused.push((path.to_string(), msg.clone()));
            return (422, status(422, "Invalid", &msg));
        }
    }
    s.patches.push((target.to_string(), body.to_string()));
    let mut stored = body.to_string();
    if s.drop_consumable_capacity
        && path.starts_with("/apis/resource.k8s.io/v1/resourceslices/")
        && let Ok(mut v) = serde_json::from_str::<serde_json::Value>(body)
    {
        for d in v["spec"]["devices"].as_array_mut().into_iter().flatten() {
            if let Some(d) = d.as_object_mut() {
                d.remove("allowMultipleAllocations");
            }
            for c in d["capacity"]
                .as_object_mut()
                .into_iter()
                .flat_map(|c| c.values_mut())
            {
                if let Some(c) = c.as_object_mut() {
                    c.remove("requestPolicy");
                }
            }
        }
        stored = v.to_string();
    }
    s.objects.insert(path.to_string(), stored.clone());
    (200, stored)
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
            "PATCH" => apply(&mut s, &target, &path, &body),
            "DELETE" => {
                s.deletes.push(target.clone());
                if path == SLICES {
                    delete_slices(&mut s, &target)
                } else {
                    match s.objects.remove(&path) {
                        Some(_) => (200, status(200, "", "deleted")),
                        None => (404, not_found(&path)),
                    }
                }
            }
            _ => (404, not_found(&path)),
        }
    };
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        422 => "Unprocessable Entity",
        500 => "Internal Server Error",
        _ => "Not Found",
    };
    let mut out = stream;
    let _ = write!(
        out,
        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
        answer.len()
    );
}

const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

/// DELETE of the ResourceSlice collection (a DeleteCollection, as the kubelet sends at start):
/// the stored slices that its `fieldSelector` picks are deleted, and the answer is their list,
/// as the real server gives it (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/delete.go,
/// `DeleteCollection`, answers the registry's result; the generic registry's `DeleteCollection`
/// (staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go) returns the list of the deleted objects). The fields a selector may name
/// are those of pkg/apis/resource/v1/conversion.go (`metadata.name`, `spec.nodeName`,
/// `spec.driver`; a slice without a node name has ""); another is a 400 with upstream's message.
/// Requirements are `=`, `==` or `!=`, joined by ','. No selector deletes every slice; a
/// `labelSelector` is refused (not served by this stand-in).
fn delete_slices(s: &mut Shared, target: &str) -> (u16, String) {
    let query = target.split_once('?').map_or("", |(_, q)| q);
    let mut selector = String::new();
    for (k, v) in query.split('&').filter_map(|kv| kv.split_once('=')) {
        match k {
            "fieldSelector" => selector = unescape(v),
            "labelSelector" => {
                return (
                    400,
                    status(
                        400,
                        "BadRequest",
                        "labelSelector: not served by the stand-in",
                    ),
                );
            }
            _ => {}
        }
    }
    let mut reqs = Vec::new();
    for r in selector.split(',').filter(|r| !r.is_empty()) {
        let (field, equal, value) = if let Some((f, v)) = r.split_once("!=") {
            (f, false, v)
        } else if let Some((f, v)) = r.split_once("==").or_else(|| r.split_once('=')) {
            (f, true, v)
        } else {
            let msg = format!("invalid selector: '{selector}'; can't understand '{r}'");
            return (400, status(400, "BadRequest", &msg));
        };
        if !["metadata.name", "spec.nodeName", "spec.driver"].contains(&field) {
            let msg = format!(
                "field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: {field}"
            );
            return (400, status(400, "BadRequest", &msg));
        }
        reqs.push((field.to_string(), equal, value.to_string()));
    }
    let picked: Vec<String> = s
        .objects
        .iter()
        .filter(|(p, _)| p.strip_prefix(SLICES).is_some_and(|n| n.starts_with('/')))
        .filter(|(_, body)| {
            let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
            reqs.iter().all(|(field, equal, value)| {
                let have = match field.as_str() {
                    "metadata.name" => &v["metadata"]["name"],
                    "spec.nodeName" => &v["spec"]["nodeName"],
                    _ => &v["spec"]["driver"],
                };
                (have.as_str().unwrap_or("") == value) == *equal
            })
        })
        .map(|(p, _)| p.clone())
        .collect();
    let items: Vec<serde_json::Value> = picked
        .iter()
        .filter_map(|p| s.objects.remove(p))
        .map(|b| serde_json::from_str(&b).unwrap_or_default())
        .collect();
    let list = serde_json::json!({"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1",
                                  "metadata": {}, "items": items});
    (200, list.to_string())
}

/// A query value, percent-decoded ('+' a space).
fn unescape(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(x)) => {
                out.push(x);
                i += 2;
            }
            (b'+', _) => out.push(b' '),
            (c, _) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn status(code: u16, reason: &str, message: &str) -> String {
    serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": if code == 200 { "Success" } else { "Failure" },
        "message": message, "reason": reason, "code": code,
    })
    .to_string()
}

fn not_found(path: &str) -> String {
    format!(
        r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":"{path} not found","reason":"NotFound","code":404}}"#
    )
}
