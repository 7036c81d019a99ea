//! The kubelet's DRA manager as a plugin meets it, for the end-to-end tests. It follows
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

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use fgpu_kubelet_api::dra::v1 as dra;

use super::kubelet::channel;

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
            let mut client =
                dra::dra_plugin_client::DraPluginClient::new(channel(&self.sock).await);
            let resp = client
                .node_prepare_resources(dra::NodePrepareResourcesRequest {
                    claims: todo.clone(),
                })
                .await
                .map_err(|s| format!("NodePrepareResources failed: {s}"))?
                .into_inner();
            for (uid, r) in &resp.claims {
                let Some(req) = todo.iter().find(|c| c.uid == *uid) else {
                    return Err(format!(
                        "NodePrepareResources returned result for unknown claim UID {uid}"
                    ));
                };
                if !r.error.is_empty() {
                    return Err(format!(
                        "NodePrepareResources failed for claim {}/{}: {}",
                        req.namespace, req.name, r.error
                    ));
                }
            }
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
                return Err(format!("NodePrepareResources left out {left} claims"));
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
        let mut client = dra::dra_plugin_client::DraPluginClient::new(channel(&self.sock).await);
        let resp = client
            .node_unprepare_resources(dra::NodeUnprepareResourcesRequest {
                claims: todo.clone(),
            })
            .await
            .map_err(|s| format!("NodeUnprepareResources failed: {s}"))?
            .into_inner();
        for (uid, r) in &resp.claims {
            let Some(req) = todo.iter().find(|c| c.uid == *uid) else {
                return Err(format!(
                    "NodeUnprepareResources returned result for unknown claim UID {uid}"
                ));
            };
            if !r.error.is_empty() {
                return Err(format!(
                    "NodeUnprepareResources failed for claim {}/{}: {}",
                    req.namespace, req.name, r.error
                ));
            }
            self.cache.remove(uid);
        }
        let left = todo.len() - resp.claims.len();
        if left != 0 {
            return Err(format!("NodeUnprepareResources left out {left} claims"));
        }
        Ok(())
    }

    /// The UIDs of the claims prepared on the node now.
    pub fn prepared(&self) -> Vec<String> {
        self.cache.keys().cloned().collect()
    }
}
