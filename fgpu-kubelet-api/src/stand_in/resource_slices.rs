//! The kubelet deleting its node's ResourceSlices when it starts.
//!
//! kubernetes/kubernetes pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go (read at commit
//! 00623539): `NewDRAPluginManager`, made when the kubelet starts, runs
//! `wipeResourceSlices(ctx, "" /* all drivers */)` in the background: no DRA driver has
//! registered yet, and a slice left published would draw pods that wait for a driver that may
//! never come back. `wipeResourceSlices` reads the kubelet's Node (while it is not found, or
//! on any error, it tries again), then deletes the collection of ResourceSlices with the
//! field selector `spec.nodeName=<node>` (`resourceapi.ResourceSliceSelectorNodeName`, in
//! staging/src/k8s.io/api/resource/v1/types.go): every driver's slices of the node, one
//! DeleteCollection call. Done when it succeeds or answers NotFound; an Unauthorized or any
//! other error is retried with a backoff of 1 s, doubling (jitter 0.2), capped at 5 min, 100
//! steps. [`wipe_resource_slices`] does the same over plain HTTP
//! (`DELETE /apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D<node>`),
//! with the same backoff without jitter and a bound on the attempts, as one-shot commands
//! and tests need.
//!
//! The same file wipes one driver's slices (selector `spec.nodeName`, `spec.driver`) 30 s
//! (`wipingDelay`) after the last plugin of that driver went away without coming back; that
//! is not imitated here.

use std::time::Duration;

use super::http;

/// The ResourceSlice collection of resource.k8s.io/v1.
pub const RESOURCE_SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

/// How long one HTTP call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// What a wipe did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wiped {
    /// The field selector of the DeleteCollection.
    pub field_selector: String,
    /// The names of the slices the API server said it deleted (its answer is the list of the
    /// deleted objects: staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go,
    /// `DeleteCollection`); empty if it answered NotFound or a bare Status.
    pub deleted: Vec<String>,
    /// The attempts it took.
    pub attempts: u32,
}

/// Deletes node `node`'s ResourceSlices (every driver's) on the API server at `api_url`, as a
/// starting kubelet does; tries `attempts` times at most (at least once), waiting 1 s, 2 s,
/// 4 s, ... between tries. The error says the last failure.
pub fn wipe_resource_slices(api_url: &str, node: &str, attempts: u32) -> Result<Wiped, String> {
    http::parse_url(api_url)?;
    if node.is_empty() {
        return Err("the node's name is empty".into());
    }
    let field_selector = format!("spec.nodeName={node}");
    let mut wait = Duration::from_secs(1);
    let mut tried = 0;
    loop {
        tried += 1;
        match wipe_once(api_url, node, &field_selector) {
            Ok(deleted) => {
                return Ok(Wiped {
                    field_selector,
                    deleted,
                    attempts: tried,
                });
            }
            Err(e) if tried >= attempts.max(1) => {
                return Err(format!(
                    "deleting the ResourceSlices of node {node} ({field_selector}), {tried} attempts: {e}"
                ));
            }
            Err(_) => {
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_secs(300));
            }
        }
    }
}

/// One round of the retry loop: the Node, then the DeleteCollection.
fn wipe_once(api_url: &str, node: &str, field_selector: &str) -> Result<Vec<String>, String> {
    let node_path = format!("/api/v1/nodes/{}", http::query_escape(node));
    let r = http::call(api_url, "GET", &node_path, CALL_TIMEOUT)?;
    match r.status {
        200 => {}
        404 => return Err(format!("node {node} not found (yet)")),
        s => return Err(format!("reading node {node}: {s} {}", message(&r.body))),
    }
    let path = format!(
        "{RESOURCE_SLICES}?fieldSelector={}",
        http::query_escape(field_selector)
    );
    let r = http::call(api_url, "DELETE", &path, CALL_TIMEOUT)?;
    match r.status {
        200 | 202 => Ok(deleted_names(&r.body)),
        404 => Ok(Vec::new()),
        s => Err(format!("DELETE {path}: {s} {}", message(&r.body))),
    }
}

/// The names of the items of a list answer; none for a Status.
fn deleted_names(body: &str) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

/// A Status answer's message, or the body as it is.
fn message(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| body.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_answer_names_the_deleted_slices_and_a_status_none() {
        let list = r#"{"kind":"ResourceSliceList","apiVersion":"resource.k8s.io/v1","metadata":{},
            "items":[{"metadata":{"name":"node-1-fgpu.io"}},{"metadata":{"name":"node-1-gpu.example.com"}}]}"#;
        assert_eq!(
            deleted_names(list),
            ["node-1-fgpu.io", "node-1-gpu.example.com"]
        );
        assert!(deleted_names(r#"{"kind":"Status","status":"Success"}"#).is_empty());
        assert_eq!(message(r#"{"kind":"Status","message":"no"}"#), "no");
    }

    #[test]
    fn bad_input_is_refused_before_any_call() {
        let e = wipe_resource_slices("https://10.0.0.1:6443", "node-1", 1).unwrap_err();
        assert!(e.contains("plain http"), "{e}");
        let e = wipe_resource_slices("http://127.0.0.1:1", "", 1).unwrap_err();
        assert!(e.contains("empty"), "{e}");
    }
}
