//! The node's ResourceSlice: one device per GPU (`gpu-<index>`), shareable by capacity
//! (`allowMultipleAllocations: true`, KEP-5075 consumable capacity) with capacities `memory`
//! (bytes; requests rounded up to a step) and `compute` (percent), and attributes `uuid`,
//! `productName`, `driverVersion`. Published with server-side apply, owned by the Node.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use k8s_openapi::api::resource::v1 as r;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::claim::{COMPUTE, MEMORY};
use super::quantity;

/// One GPU as the slice shows it.
#[derive(Debug, Clone)]
pub struct SliceGpu {
    pub index: u32,
    pub uuid: String,
    pub product: String,
    pub driver_version: String,
    pub memory_bytes: u64,
}

/// The step memory requests are rounded up to (and the least one).
pub const MEMORY_STEP: u64 = 256 << 20;

/// What a claim that names no memory gets: the GPU's memory rounded down to whole steps
/// (one step at least).
pub fn default_memory(total: u64) -> u64 {
    (total / MEMORY_STEP * MEMORY_STEP).max(MEMORY_STEP)
}

pub fn device_name(index: u32) -> String {
    format!("gpu-{index}")
}

pub fn slice_name(node: &str, driver: &str) -> String {
    format!("{node}-{}", driver.replace('/', "-"))
}

pub fn build(node: &str, driver: &str, gpus: &[SliceGpu]) -> r::ResourceSlice {
    let q = |s: String| Quantity(s);
    let devices = gpus
        .iter()
        .map(|g| {
            let attr = |s: &str| r::DeviceAttribute {
                string: Some(s.to_string()),
                ..Default::default()
            };
            let attributes = BTreeMap::from([
                ("uuid".to_string(), attr(&g.uuid)),
                ("productName".to_string(), attr(&g.product)),
                ("driverVersion".to_string(), attr(&g.driver_version)),
            ]);
            let memory = r::DeviceCapacity {
                value: q(g.memory_bytes.to_string()),
                request_policy: Some(r::CapacityRequestPolicy {
                    // A claim that names no memory takes the whole GPU's, in whole steps:
                    // the API server requires the default to be min + n × step
                    // (pkg/apis/resource/validation, validateRequestPolicyRangeStep), and
                    // an H200's 143771 MiB is not a multiple of 256 MiB (NVIDIA's driver
                    // rounds down likewise).
                    default: Some(q(default_memory(g.memory_bytes).to_string())),
                    valid_range: Some(r::CapacityRequestPolicyRange {
                        min: q(quantity::bytes(MEMORY_STEP)),
                        max: None,
                        step: Some(q(quantity::bytes(MEMORY_STEP))),
                    }),
                    valid_values: None,
                }),
            };
            let compute = r::DeviceCapacity {
                value: q("100".into()),
                request_policy: Some(r::CapacityRequestPolicy {
                    // A claim that names no compute gets no guaranteed share (it runs in
                    // what the others leave).
                    default: Some(q("0".into())),
                    valid_range: Some(r::CapacityRequestPolicyRange {
                        min: q("0".into()),
                        max: Some(q("100".into())),
                        step: Some(q("1".into())),
                    }),
                    valid_values: None,
                }),
            };
            r::Device {
                name: device_name(g.index),
                allow_multiple_allocations: Some(true),
                attributes: Some(attributes),
                capacity: Some(BTreeMap::from([
                    (MEMORY.to_string(), memory),
                    (COMPUTE.to_string(), compute),
                ])),
                ..Default::default()
            }
        })
        .collect();
    r::ResourceSlice {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(slice_name(node, driver)),
            ..Default::default()
        },
        spec: r::ResourceSliceSpec {
            driver: driver.to_string(),
            node_name: Some(node.to_string()),
            pool: r::ResourcePool {
                name: node.to_string(),
                generation: 1,
                resource_slice_count: 1,
            },
            devices: Some(devices),
            ..Default::default()
        },
    }
}

/// Applies the slice (server-side apply, field manager `fgpu`), owned by the Node when the
/// Node can be read (so it goes with the Node).
pub async fn publish(
    client: &kube::Client,
    node: &str,
    driver: &str,
    gpus: &[SliceGpu],
) -> Result<()> {
    let mut slice = build(node, driver, gpus);
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    match nodes.get(node).await {
        Ok(n) => {
            if let Some(uid) = n.metadata.uid {
                slice.metadata.owner_references = Some(vec![
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        name: node.to_string(),
                        uid,
                        controller: Some(true),
                        ..Default::default()
                    },
                ]);
            }
        }
        Err(err) => tracing::warn!(
            node,
            "cannot read the Node (the slice gets no owner): {err}"
        ),
    }
    let mut value = serde_json::to_value(&slice)?;
    value["apiVersion"] = "resource.k8s.io/v1".into();
    value["kind"] = "ResourceSlice".into();
    let api: kube::Api<r::ResourceSlice> = kube::Api::all(client.clone());
    let name = slice_name(node, driver);
    api.patch(
        &name,
        &kube::api::PatchParams::apply("fgpu").force(),
        &kube::api::Patch::Apply(&value),
    )
    .await
    .with_context(|| format!("publishing ResourceSlice {name}"))?;
    tracing::info!(slice = %name, devices = gpus.len(), "ResourceSlice published");
    Ok(())
}

/// Retries of a failed publish wait this long at first, doubling up to the recheck period.
const RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether the stored slice kept what makes its devices shareable by capacity (an API server
/// without DRAConsumableCapacity drops these fields on write, silently).
fn shareable(spec: &r::ResourceSliceSpec) -> bool {
    spec.devices.iter().flatten().all(|d| {
        d.allow_multiple_allocations == Some(true)
            && d.capacity
                .as_ref()
                .and_then(|c| c.get(MEMORY))
                .is_some_and(|m| m.request_policy.is_some())
    })
}

fn device_names(spec: &r::ResourceSliceSpec) -> Vec<String> {
    let mut v: Vec<String> = spec
        .devices
        .iter()
        .flatten()
        .map(|d| d.name.clone())
        .collect();
    v.sort();
    v
}

/// Publishes the slice and keeps it published: every `recheck` it is read back and applied
/// again if it is gone (the kubelet deletes a node's slices when it starts and 30 s after a
/// plugin unregisters: pkg/kubelet/cm/dra/plugin; an administrator) or does not offer this
/// node's devices; a failed publish or read is retried after 1 s, 2 s, ... up to `recheck`.
/// Never returns.
pub async fn keep_published(
    client: kube::Client,
    node: String,
    driver: String,
    gpus: Vec<SliceGpu>,
    recheck: std::time::Duration,
) {
    let api: kube::Api<r::ResourceSlice> = kube::Api::all(client.clone());
    let name = slice_name(&node, &driver);
    let want = device_names(&build(&node, &driver, &gpus).spec);
    let mut published = false;
    let mut retry = RETRY;
    let mut said_dropped = false;
    loop {
        let result = if published {
            match api.get_opt(&name).await {
                // Its devices by name: the API server canonicalises quantities
                // ("17179869184" reads back as "16Gi") and defaults fields.
                Ok(Some(s)) if device_names(&s.spec) == want => {
                    if !said_dropped && !shareable(&s.spec) {
                        said_dropped = true;
                        tracing::error!(
                            slice = %name,
                            "the API server stored the node's ResourceSlice without \
                             allowMultipleAllocations or the capacities' requestPolicy: its \
                             DRAConsumableCapacity feature gate is off (Kubernetes 1.34/1.35 \
                             default), so a GPU goes whole to one claim and claims' memory and \
                             compute requests are not honoured. Turn the gate on (API server, \
                             scheduler, kubelet) or install with --set mode=devicePlugin"
                        );
                    }
                    Ok(())
                }
                Ok(found) => {
                    tracing::warn!(
                        slice = %name,
                        "the node's ResourceSlice is {}: publishing it again",
                        if found.is_some() { "not what this node offers" } else { "gone (a kubelet restart?)" }
                    );
                    publish(&client, &node, &driver, &gpus).await
                }
                Err(err) => {
                    Err(anyhow::Error::from(err).context(format!("reading ResourceSlice {name}")))
                }
            }
        } else {
            publish(&client, &node, &driver, &gpus).await
        };
        let wait = match result {
            Ok(()) => {
                published = true;
                retry = RETRY;
                recheck
            }
            Err(err) => {
                let wait = retry.min(recheck);
                retry = (retry * 2).min(recheck);
                tracing::error!(retry_in_s = wait.as_secs(), "{err:#}");
                wait
            }
        };
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shareable_device_per_gpu() {
        let g = SliceGpu {
            index: 0,
            uuid: "GPU-x".into(),
            product: "NVIDIA H200".into(),
            driver_version: "580.65.06".into(),
            memory_bytes: 80 << 30,
        };
        let s = build("node-1", "fgpu.io", &[g]);
        let v = serde_json::to_value(&s).unwrap();
        let d = &v["spec"]["devices"][0];
        assert_eq!(d["name"], "gpu-0");
        assert_eq!(d["allowMultipleAllocations"], true);
        assert_eq!(d["capacity"]["memory"]["value"], (80u64 << 30).to_string());
        assert_eq!(
            d["capacity"]["memory"]["requestPolicy"]["validRange"]["step"],
            "256Mi"
        );
        assert_eq!(d["capacity"]["compute"]["value"], "100");
        assert_eq!(d["attributes"]["uuid"]["string"], "GPU-x");
        assert_eq!(v["spec"]["pool"]["name"], "node-1");
        assert_eq!(v["metadata"]["name"], "node-1-fgpu.io");
    }

    #[test]
    fn the_default_memory_is_whole_steps_of_the_gpu() {
        let mib = 1u64 << 20;
        // H200 (143771 MiB), a 16 GiB sim GPU, 80 and 24 GiB GPUs, a tiny one.
        assert_eq!(default_memory(143_771 * mib), 143_616 * mib);
        assert_eq!(default_memory(16 << 30), 16 << 30);
        assert_eq!(default_memory(81_559 * mib), 81_408 * mib);
        assert_eq!(default_memory(24_564 * mib), 24_320 * mib);
        assert_eq!(default_memory(100 * mib), MEMORY_STEP);
        for total in [143_771 * mib, 81_559 * mib, 24_564 * mib, 16 << 30] {
            assert_eq!(default_memory(total) % MEMORY_STEP, 0);
            assert!(default_memory(total) <= total);
        }
    }
}
