//! The kubelet's DRA manager as a plugin meets it, for tests and `fgpu-test-kubelet`. It follows
//! kubernetes/kubernetes pkg/kubelet/cm/dra/manager.go (`PrepareResources`,
//! `UnprepareResources`) and its claim-info cache (claiminfo.go):
//!
//! - a pod's claims are prepared before its containers start; a claim already prepared on the
//!   node (by another pod that shares it) is not prepared again — the pod is only added to the
//!   claim's pod references, and the plugin gets no call;
//! - the claims still to prepare go to the plugin in one NodePrepareResources call; an error
//!   of the call, or of any claim in its answer, fails the pod's start (the kubelet's
//!   `FailedPrepareDynamicResources` event carries the text), and the claim is not cached, so
//!   the next start of the pod calls the plugin again (upstream caches the claims whose
//!   results it read before the failing one, in Go's random map order; here none of that
//!   call is: either way the plugin's prepare must be idempotent);
//! - when a pod goes, a claim that other pods still reference only loses the pod's reference;
//!   the last pod's removal calls NodeUnprepareResources, and the claim leaves the cache when
//!   that succeeds.
//!
//! The messages are upstream's (`NodePrepareResources failed for claim NS/NAME: ERR`, ...).
//! The cache can be saved to a file and loaded again, as the kubelet checkpoints it
//! (pkg/kubelet/cm/dra/state), so that one-shot commands act as one kubelet.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::channel;
use crate::dra::v1 as dra;

/// One claim in the cache: who uses it, and what its prepare answered.
struct ClaimInfo {
    claim: dra::Claim,
    pods: BTreeSet<String>,
    devices: Vec<dra::Device>,
}

pub struct DraManager {
    sock: PathBuf,
    cache: BTreeMap<String, ClaimInfo>,
    /// NodePrepareResources / NodeUnprepareResources calls made to the plugin.
    pub prepare_calls: usize,
    pub unprepare_calls: usize,
}

impl DraManager {
    /// The manager of a kubelet talking to the plugin on `dra_sock`.
    pub fn new(dra_sock: &Path) -> Self {
        Self {
            sock: dra_sock.to_path_buf(),
            cache: BTreeMap::new(),
            prepare_calls: 0,
            unprepare_calls: 0,
        }
    }

    /// The plugin moved to another socket (a restarted plugin registers anew).
    pub fn redial(&mut self, dra_sock: &Path) {
        self.sock = dra_sock.to_path_buf();
    }

    /// Prepares pod `pod`'s `claims` before its containers would start: the devices of each
    /// claim (by UID), or the error that keeps the pod from starting.
    pub async fn prepare_pod(
        &mut self,
        pod: &str,
        claims: &[dra::Claim],
    ) -> Result<BTreeMap<String, Vec<dra::Device>>, String> {
        let mut todo = Vec::new();
        for c in claims {
            match self.cache.get_mut(&c.uid) {
                Some(info) => {
                    info.pods.insert(pod.to_string());
                }
                None => todo.push(c.clone()),
            }
        }
        if !todo.is_empty() {
            self.prepare_calls += 1;
            const CALL: &str = "NodePrepareResources";
            let ch = channel(&self.sock)
                .await
                .map_err(|e| format!("{CALL} failed: {e}"))?;
            let resp = dra::dra_plugin_client::DraPluginClient::new(ch)
                .node_prepare_resources(dra::NodePrepareResourcesRequest {
                    claims: todo.clone(),
                })
                .await
                .map_err(|s| format!("{CALL} failed: {s}"))?
                .into_inner();
            check(CALL, &todo, resp.claims.iter().map(|(u, r)| (u, &r.error)))?;
            for (uid, r) in resp.claims {
                let claim = todo.iter().find(|c| c.uid == uid).cloned().expect("asked");
                self.cache.insert(
                    uid,
                    ClaimInfo {
                        claim,
                        pods: BTreeSet::from([pod.to_string()]),
                        devices: r.devices,
                    },
                );
            }
            let left = todo
                .iter()
                .filter(|c| !self.cache.contains_key(&c.uid))
                .count();
            if left != 0 {
                return Err(format!("{CALL} left out {left} claims"));
            }
        }
        Ok(claims
            .iter()
            .map(|c| (c.uid.clone(), self.cache[&c.uid].devices.clone()))
            .collect())
    }

    /// Pod `pod` is gone: its claims that no other pod references are unprepared.
    pub async fn unprepare_pod(&mut self, pod: &str) -> Result<(), String> {
        let mut todo = Vec::new();
        for info in self.cache.values_mut() {
            if !info.pods.contains(pod) {
                continue;
            }
            if info.pods.len() > 1 {
                info.pods.remove(pod);
            } else {
                todo.push(info.claim.clone());
            }
        }
        if todo.is_empty() {
            return Ok(());
        }
        self.unprepare_calls += 1;
        const CALL: &str = "NodeUnprepareResources";
        let ch = channel(&self.sock)
            .await
            .map_err(|e| format!("{CALL} failed: {e}"))?;
        let resp = dra::dra_plugin_client::DraPluginClient::new(ch)
            .node_unprepare_resources(dra::NodeUnprepareResourcesRequest {
                claims: todo.clone(),
            })
            .await
            .map_err(|s| format!("{CALL} failed: {s}"))?
            .into_inner();
        check(CALL, &todo, resp.claims.iter().map(|(u, r)| (u, &r.error)))?;
        for uid in resp.claims.keys() {
            self.cache.remove(uid);
        }
        let left = todo.len() - resp.claims.len();
        if left != 0 {
            return Err(format!("{CALL} left out {left} claims"));
        }
        Ok(())
    }

    /// The UIDs of the claims prepared on the node now.
    pub fn prepared(&self) -> Vec<String> {
        self.cache.keys().cloned().collect()
    }

    /// The cache as JSON (the kubelet's checkpoint of its claim infos, in our own layout).
    pub fn save(&self) -> Value {
        let claims: Vec<Value> = self
            .cache
            .values()
            .map(|i| {
                let devices: Vec<Value> = i
                    .devices
                    .iter()
                    .map(|d| {
                        json!({"requests": d.request_names, "pool": d.pool_name,
                               "device": d.device_name, "cdi": d.cdi_device_ids})
                    })
                    .collect();
                json!({"namespace": i.claim.namespace, "name": i.claim.name, "uid": i.claim.uid,
                       "pods": i.pods, "devices": devices})
            })
            .collect();
        json!({ "claims": claims })
    }

    /// A manager on `dra_sock` with the cache `state` (from [`save`](Self::save)).
    pub fn load(dra_sock: &Path, state: &Value) -> Result<Self, String> {
        let mut m = Self::new(dra_sock);
        let bad = || "not a saved DRA manager state".to_string();
        let strs = |v: &Value| -> Result<Vec<String>, String> {
            v.as_array()
                .ok_or_else(bad)?
                .iter()
                .map(|s| s.as_str().map(str::to_string).ok_or_else(bad))
                .collect()
        };
        let text = |v: &Value, k: &str| v[k].as_str().map(str::to_string).ok_or_else(bad);
        for c in state["claims"].as_array().ok_or_else(bad)? {
            let claim = dra::Claim {
                namespace: text(c, "namespace")?,
                name: text(c, "name")?,
                uid: text(c, "uid")?,
            };
            let devices = c["devices"]
                .as_array()
                .ok_or_else(bad)?
                .iter()
                .map(|d| {
                    Ok(dra::Device {
                        request_names: strs(&d["requests"])?,
                        pool_name: text(d, "pool")?,
                        device_name: text(d, "device")?,
                        cdi_device_ids: strs(&d["cdi"])?,
                    })
                })
                .collect::<Result<Vec<_>, String>>()?;
            let pods = strs(&c["pods"])?.into_iter().collect();
            m.cache.insert(
                claim.uid.clone(),
                ClaimInfo {
                    claim,
                    pods,
                    devices,
                },
            );
        }
        Ok(m)
    }
}

/// The kubelet's checks of a plugin's answer to `call` for the claims `asked`: a result for a
/// claim it did not ask for, or any claim's error, fails the whole call (upstream's messages).
fn check<'a>(
    call: &str,
    asked: &[dra::Claim],
    results: impl Iterator<Item = (&'a String, &'a String)>,
) -> Result<(), String> {
    for (uid, error) in results {
        let Some(req) = asked.iter().find(|c| c.uid == *uid) else {
            return Err(format!(
                "{call} returned result for unknown claim UID {uid}"
            ));
        };
        if !error.is_empty() {
            return Err(format!(
                "{call} failed for claim {}/{}: {error}",
                req.namespace, req.name
            ));
        }
    }
    Ok(())
}
