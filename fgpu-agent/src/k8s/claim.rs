//! What a prepared ResourceClaim means for fgpu: the GPU its allocation picked for this
//! driver, the capacities it consumes there (`memory` bytes, `compute` percent), and the pods
//! it is reserved for, and the opaque configuration its allocation carries for this driver
//! (`parkAfter`). Pure: from the claim as the API server returned it.

use std::collections::BTreeMap;

use anyhow::{Result, bail};
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};

use super::opaque::park_after;
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
    /// Parkable after this long without GPU use, ms (docs/parking.md): the `parkAfter` of
    /// the opaque configuration for this driver ([`park_after`], in [`super::opaque`]); `None`: not set by the
    /// claim or its class (the pod's cgroup inherits, as any cgroup does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub park_after_ms: Option<u64>,
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
    let mut result_refs: Vec<&str> = Vec::new();
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
        result_refs.push(&r.request);
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
    let configs = alloc
        .devices
        .as_ref()
        .and_then(|d| d.config.as_deref())
        .unwrap_or_default();
    let park_after_ms = park_after(configs, driver, &result_refs).map_err(|e| {
        anyhow::anyhow!(
            "ResourceClaim {}/{}: {e:#}",
            meta.namespace.as_deref().unwrap_or(""),
            meta.name.as_deref().unwrap_or("")
        )
    })?;
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
        park_after_ms,
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

    /// [`claim_json`] with `config` (JSON of `DeviceAllocationConfiguration`s, as the
    /// scheduler writes them) in `status.allocation.devices.config`, and the claim's own
    /// entries (those `FromClaim`, without `source`) in `spec.devices.config`.
    pub fn claim_with_config(name: &str, config: &[serde_json::Value]) -> ResourceClaim {
        let mut v: serde_json::Value = serde_json::from_str(&claim_json(
            "u",
            name,
            "8Gi",
            "30",
            &["0c3d6f1e-2b4a-4c8e-9f00-123456789abc"],
        ))
        .unwrap();
        let spec: Vec<serde_json::Value> = config
            .iter()
            .filter(|c| c["source"] == "FromClaim")
            .map(|c| {
                let mut c = c.clone();
                c.as_object_mut().unwrap().remove("source");
                c
            })
            .collect();
        v["spec"]["devices"]["config"] = spec.into();
        v["status"]["allocation"]["devices"]["config"] = config.to_vec().into();
        serde_json::from_value(v).unwrap()
    }

    /// One `DeviceAllocationConfiguration`: `source`, `requests` (none: all), the opaque
    /// driver and parameters.
    fn config(
        source: &str,
        requests: &[&str],
        driver: &str,
        parameters: serde_json::Value,
    ) -> serde_json::Value {
        let mut c = serde_json::json!({
            "source": source,
            "opaque": {"driver": driver, "parameters": parameters},
        });
        if !requests.is_empty() {
            c["requests"] = requests.into();
        }
        c
    }

    fn park(claim: &ResourceClaim) -> Result<Option<u64>> {
        Ok(plan(claim, "fgpu.io", "u")?.unwrap().park_after_ms)
    }

    #[test]
    fn park_after_from_the_claim() {
        use serde_json::json;
        let c = claim_with_config(
            "c",
            &[config(
                "FromClaim",
                &[],
                "fgpu.io",
                json!({"parkAfter": "30s"}),
            )],
        );
        assert_eq!(park(&c).unwrap(), Some(30_000));
        // Naming the request, or its main request for a subrequest's result.
        let c = claim_with_config(
            "c",
            &[config(
                "FromClaim",
                &["gpu"],
                "fgpu.io",
                json!({"parkAfter": "2m"}),
            )],
        );
        assert_eq!(park(&c).unwrap(), Some(120_000));
        let mut sub = claim_with_config(
            "c",
            &[config(
                "FromClaim",
                &["gpu"],
                "fgpu.io",
                json!({"parkAfter": "500ms"}),
            )],
        );
        let results = &mut sub.status.as_mut().unwrap().allocation.as_mut().unwrap();
        results.devices.as_mut().unwrap().results.as_mut().unwrap()[0].request = "gpu/small".into();
        assert_eq!(park(&sub).unwrap(), Some(500));
        // None given: not parkable by the claim.
        assert_eq!(park(&claim_with_config("c", &[])).unwrap(), None);
        let empty = claim_with_config("c", &[config("FromClaim", &[], "fgpu.io", json!({}))]);
        assert_eq!(park(&empty).unwrap(), None);
    }

    #[test]
    fn park_after_from_the_class() {
        use serde_json::json;
        let c = claim_with_config(
            "c",
            &[config(
                "FromClass",
                &[],
                "fgpu.io",
                json!({"parkAfter": "1h"}),
            )],
        );
        assert!(
            c.spec.devices.as_ref().unwrap().config.as_deref() == Some(&[]),
            "a class's configuration is in the allocation only"
        );
        assert_eq!(park(&c).unwrap(), Some(3_600_000));
    }

    #[test]
    fn the_claims_park_after_overrides_the_classs() {
        use serde_json::json;
        let class = config("FromClass", &[], "fgpu.io", json!({"parkAfter": "10m"}));
        let claim = config("FromClaim", &[], "fgpu.io", json!({"parkAfter": "45s"}));
        // In either order in the list: the claim's is more specific.
        for list in [
            [class.clone(), claim.clone()],
            [claim.clone(), class.clone()],
        ] {
            assert_eq!(park(&claim_with_config("c", &list)).unwrap(), Some(45_000));
        }
        // A claim entry without parkAfter keeps the class's.
        let other = config("FromClaim", &[], "fgpu.io", json!({}));
        assert_eq!(
            park(&claim_with_config("c", &[class, other])).unwrap(),
            Some(600_000)
        );
        // Within one source the later entry wins.
        let first = config("FromClaim", &[], "fgpu.io", json!({"parkAfter": "1s"}));
        let second = config("FromClaim", &[], "fgpu.io", json!({"parkAfter": "2s"}));
        assert_eq!(
            park(&claim_with_config("c", &[first, second])).unwrap(),
            Some(2_000)
        );
    }

    #[test]
    fn another_drivers_config_is_ignored() {
        use serde_json::json;
        // Parameters fgpu would refuse, under another driver's name: not read at all.
        let c = claim_with_config(
            "c",
            &[
                config(
                    "FromClaim",
                    &[],
                    "gpu.nvidia.com",
                    json!({"parkAfter": "0", "x": 1}),
                ),
                config("FromClass", &[], "fgpu.io.example", json!("not an object")),
            ],
        );
        assert_eq!(park(&c).unwrap(), None);
        // An entry that is not opaque names no driver.
        let c = claim_with_config("c", &[json!({"source": "FromClaim"})]);
        assert_eq!(park(&c).unwrap(), None);
    }

    #[test]
    fn config_for_another_request_is_ignored() {
        use serde_json::json;
        let c = claim_with_config(
            "c",
            &[
                config(
                    "FromClaim",
                    &["nic"],
                    "fgpu.io",
                    json!({"parkAfter": "bad"}),
                ),
                config(
                    "FromClaim",
                    &["gpux", "gpu-2"],
                    "fgpu.io",
                    json!({"parkAfter": "5s"}),
                ),
            ],
        );
        assert_eq!(park(&c).unwrap(), None);
        // A subrequest of another main request does not name ours either.
        let c = claim_with_config(
            "c",
            &[config(
                "FromClaim",
                &["other/gpu"],
                "fgpu.io",
                json!({"parkAfter": "5s"}),
            )],
        );
        assert_eq!(park(&c).unwrap(), None);
        // One of several names is ours: it applies.
        let c = claim_with_config(
            "c",
            &[config(
                "FromClaim",
                &["nic", "gpu"],
                "fgpu.io",
                json!({"parkAfter": "5s"}),
            )],
        );
        assert_eq!(park(&c).unwrap(), Some(5_000));
    }

    #[test]
    fn bad_park_after_values_are_refused_naming_the_claim_and_the_field() {
        use serde_json::json;
        for (entry, needle) in [
            (json!({"parkAfter": "soon"}), "parkAfter: \"soon\""),
            (json!({"parkAfter": "0"}), "parkAfter: \"0\": 0 would park"),
            (json!({"parkAfter": "0s"}), "0 would park"),
            (json!({"parkAfter": ""}), "parkAfter: \"\""),
            (
                json!({"parkAfter": 30}),
                "parkAfter: 30 is not a duration string",
            ),
            (
                json!({"parkAfter": "30s", "memory": "1Gi"}),
                "unknown key \"memory\"",
            ),
            (json!({"park_after": "30s"}), "unknown key \"park_after\""),
            (json!("30s"), "a JSON object"),
            (json!(null), "a JSON object"),
        ] {
            for source in ["FromClaim", "FromClass"] {
                let c =
                    claim_with_config("trainer", &[config(source, &[], "fgpu.io", entry.clone())]);
                let err = format!("{:#}", plan(&c, "fgpu.io", "u").unwrap_err());
                assert!(err.contains("ResourceClaim team-a/trainer"), "{err}");
                assert!(err.contains("status.allocation.devices.config[0]"), "{err}");
                assert!(err.contains(needle), "{needle}: {err}");
                let from = if source == "FromClass" {
                    "DeviceClass's spec.config"
                } else {
                    "claim's spec.devices.config"
                };
                assert!(err.contains(from), "{from}: {err}");
            }
        }
        // Overridden, a bad class value is still refused (the class is wrong for every
        // claim of it); so is a bad entry after a good one.
        let c = claim_with_config(
            "trainer",
            &[
                config("FromClass", &[], "fgpu.io", json!({"parkAfter": "never"})),
                config("FromClaim", &[], "fgpu.io", json!({"parkAfter": "30s"})),
            ],
        );
        let err = format!("{:#}", plan(&c, "fgpu.io", "u").unwrap_err());
        assert!(
            err.contains("config[0]") && err.contains("\"never\""),
            "{err}"
        );
        // An unknown source on an entry of ours.
        let c = claim_with_config(
            "trainer",
            &[config(
                "FromNowhere",
                &[],
                "fgpu.io",
                json!({"parkAfter": "30s"}),
            )],
        );
        let err = format!("{:#}", plan(&c, "fgpu.io", "u").unwrap_err());
        assert!(
            err.contains("team-a/trainer") && err.contains("FromNowhere"),
            "{err}"
        );
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
