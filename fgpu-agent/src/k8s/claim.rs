//! What a prepared ResourceClaim means for fgpu: the GPU its allocation picked for this
//! driver, the capacities it consumes there (`memory` bytes, `compute` percent), and the pods
//! it is reserved for. Pure: from the claim as the API server returned it.

use std::collections::BTreeMap;

use anyhow::{Result, bail};
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};

use super::quantity;

/// The capacity names fgpu publishes and reads back.
pub const MEMORY: &str = "memory";
pub const COMPUTE: &str = "compute";

/// One claim, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// The pool and device (fgpu's device name, `gpu-<index>`) of the results for this driver.
    pub pool: String,
    pub device: String,
    /// The requests of the claim those results answer.
    pub requests: Vec<String>,
    /// Consumed memory, bytes; `None`: the whole GPU (no consumable capacity on the result).
    pub memory_bytes: Option<u64>,
    /// Consumed compute, percent (0: no guaranteed share); `None`: the whole GPU.
    pub compute_pct: Option<u8>,
    /// The UIDs of the pods in `status.reservedFor`.
    pub pods: Vec<String>,
    /// Their names, by UID (for `fgpu status`; names that are not Kubernetes object names
    /// are left out).
    #[serde(default)]
    pub pod_names: BTreeMap<String, String>,
}

/// Reads `claim` for `driver`. `expect_uid` is the UID the kubelet asked for: a claim of the
/// same name but another UID is a different (recreated) claim and is refused.
pub fn plan(claim: &ResourceClaim, driver: &str, expect_uid: &str) -> Result<Option<Plan>> {
    let meta = &claim.metadata;
    let uid = meta.uid.clone().unwrap_or_default();
    if uid != expect_uid {
        bail!(
            "the API server's claim {}/{} has UID {uid}, not {expect_uid} (it was deleted and \
             recreated)",
            meta.namespace.as_deref().unwrap_or(""),
            meta.name.as_deref().unwrap_or("")
        );
    }
    let status = claim.status.as_ref();
    let Some(alloc) = status.and_then(|s| s.allocation.as_ref()) else {
        bail!("the claim is not allocated (status.allocation is empty)");
    };
    let results: Vec<_> = alloc
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .map(|r| r.iter().filter(|r| r.driver == driver).collect())
        .unwrap_or_default();
    let Some(first) = results.first() else {
        return Ok(None); // nothing of ours in this claim
    };
    let mut memory: Option<u64> = Some(0);
    let mut compute: Option<u64> = Some(0);
    let mut requests = Vec::new();
    for r in &results {
        if (r.pool.as_str(), r.device.as_str()) != (first.pool.as_str(), first.device.as_str()) {
            bail!(
                "the claim has devices {} and {} of driver {driver}: fgpu gives a claim a share \
                 of one GPU (use one request per GPU, in separate claims)",
                first.device,
                r.device
            );
        }
        // A prioritized list's result names its subrequest (`gpu/small`); the containers of
        // the pod name the request (`resources.claims[].request: gpu`), and the kubelet
        // matches the prepared devices to them by that name
        // (k8s.io/dynamic-resource-allocation/resourceclaim `BaseRequestRef`).
        let base = r.request.split('/').next().unwrap_or_default().to_string();
        if !requests.contains(&base) {
            requests.push(base);
        }
        let cap = r.consumed_capacity.as_ref();
        let get = |name: &str| -> Result<Option<u64>> {
            cap.and_then(|c| c.get(name))
                .map(|q| {
                    quantity::parse(&q.0)
                        .map_err(|e| anyhow::anyhow!("consumedCapacity.{name}: {e}"))
                })
                .transpose()
        };
        memory = match (memory, get(MEMORY)?) {
            (Some(m), Some(v)) => Some(m.saturating_add(v)),
            _ => None,
        };
        compute = match (compute, get(COMPUTE)?) {
            (Some(c), Some(v)) => Some(c.saturating_add(v)),
            _ => None,
        };
    }
    let memory_bytes = match memory {
        Some(0) => bail!("the claim consumes 0 bytes of GPU memory: nothing could be allocated"),
        m => m,
    };
    let compute_pct = match compute {
        None => None,
        // All of it: the whole GPU, no share to hold.
        Some(c) if c >= 100 => None,
        Some(c) => Some(c as u8),
    };
    let consumers: Vec<_> = status
        .and_then(|s| s.reserved_for.as_ref())
        .map(|r| {
            r.iter()
                .filter(|c| c.resource == "pods" && c.api_group.as_deref().unwrap_or("").is_empty())
                .collect()
        })
        .unwrap_or_default();
    let pods: Vec<String> = consumers.iter().map(|c| c.uid.clone()).collect();
    let pod_names: BTreeMap<String, String> = consumers
        .iter()
        .filter(|c| crate::api::is_object_name(&c.name))
        .map(|c| (c.uid.clone(), c.name.clone()))
        .collect();
    if pods.is_empty() {
        bail!("the claim is reserved for no pod (status.reservedFor has no pods)");
    }
    if let Some(bad) = pods
        .iter()
        .find(|p| !fgpu_common::cgroup::naming::pod_uid_fits(p))
    {
        bail!("status.reservedFor has a pod UID that is not a UID: {bad:?}");
    }
    Ok(Some(Plan {
        uid,
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        pool: first.pool.clone(),
        device: first.device.clone(),
        requests,
        memory_bytes,
        compute_pct,
        pods,
        pod_names,
    }))
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A claim as the API server returns it after allocation (consumable capacity).
    pub fn claim_json(uid: &str, name: &str, memory: &str, compute: &str, pods: &[&str]) -> String {
        let reserved: Vec<String> = pods
            .iter()
            .map(|p| format!(r#"{{"resource":"pods","name":"pod-{p}","uid":"{p}"}}"#))
            .collect();
        format!(
            r#"{{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim",
            "metadata":{{"name":"{name}","namespace":"team-a","uid":"{uid}"}},
            "spec":{{"devices":{{"requests":[{{"name":"gpu","exactly":{{"deviceClassName":"fgpu.io",
              "capacity":{{"requests":{{"memory":"{memory}","compute":"{compute}"}}}}}}}}]}}}},
            "status":{{"allocation":{{"devices":{{"results":[{{"request":"gpu","driver":"fgpu.io",
              "pool":"node-1","device":"gpu-0","shareID":"5b3c2f7e-0000-4000-8000-00000000000{}",
              "consumedCapacity":{{"memory":"{memory}","compute":"{compute}"}}}}]}}}},
              "reservedFor":[{}]}}}}"#,
            name.len() % 10,
            reserved.join(",")
        )
    }

    fn parse(json: &str) -> ResourceClaim {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn consumed_capacity_and_pods() {
        let c = parse(&claim_json(
            "u1",
            "c1",
            "8Gi",
            "30",
            &["0c3d6f1e-2b4a-4c8e-9f00-123456789abc"],
        ));
        let p = plan(&c, "fgpu.io", "u1").unwrap().unwrap();
        assert_eq!(p.memory_bytes, Some(8 << 30));
        assert_eq!(p.compute_pct, Some(30));
        assert_eq!(p.pods, ["0c3d6f1e-2b4a-4c8e-9f00-123456789abc"]);
        assert_eq!(
            p.pod_names["0c3d6f1e-2b4a-4c8e-9f00-123456789abc"],
            "pod-0c3d6f1e-2b4a-4c8e-9f00-123456789abc"
        );
        assert_eq!((p.pool.as_str(), p.device.as_str()), ("node-1", "gpu-0"));
        assert_eq!(plan(&c, "other.io", "u1").unwrap(), None, "not ours");
        let err = plan(&c, "fgpu.io", "u2").unwrap_err().to_string();
        assert!(err.contains("recreated"), "{err}");
        // A prioritized list's result (`gpu/small`): the request it answers is `gpu`.
        let sub = parse(
            &claim_json("u1", "c1", "8Gi", "30", &["aa"])
                .replace(r#""request":"gpu","#, r#""request":"gpu/small","#),
        );
        assert_eq!(
            plan(&sub, "fgpu.io", "u1").unwrap().unwrap().requests,
            ["gpu"]
        );
        let whole = parse(&claim_json("u1", "c1", "8Gi", "100", &["aa"]));
        assert_eq!(
            plan(&whole, "fgpu.io", "u1").unwrap().unwrap().compute_pct,
            None
        );
    }

    #[test]
    fn hostile_claims_are_refused() {
        for (json, needle) in [
            (
                claim_json("u", "c", "8Gi", "30", &[]),
                "reserved for no pod",
            ),
            (claim_json("u", "c", "8Gi", "30", &["../x"]), "not a UID"),
            (
                claim_json("u", "c", "lots", "30", &["aa"]),
                "consumedCapacity.memory",
            ),
            (claim_json("u", "c", "0", "30", &["aa"]), "0 bytes"),
        ] {
            let err = plan(&parse(&json), "fgpu.io", "u").unwrap_err().to_string();
            assert!(err.contains(needle), "{needle}: {err}");
        }
        let mut c = parse(&claim_json("u", "c", "8Gi", "30", &["aa"]));
        c.status.as_mut().unwrap().allocation = None;
        assert!(
            plan(&c, "fgpu.io", "u")
                .unwrap_err()
                .to_string()
                .contains("not allocated")
        );
    }
}
