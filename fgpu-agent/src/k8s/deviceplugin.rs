//! The device-plugin fallback (kubelet device-plugin API v1beta1), for clusters without
//! DRA consumable capacity: two extended resources counted in units, `<prefix>/gpu-memory`
//! (one device per `--memory-unit` of each GPU) and `<prefix>/gpu-compute` (one per percent of
//! each GPU). A container's units must all be on one GPU: `GetPreferredAllocation` picks them
//! so, and `Allocate` refuses units that span GPUs (the default scheduler only counts
//! node-wide totals, so on a node with one GPU this is exact). `Allocate` answers with fgpu's
//! CDI device for that GPU and the environment (`FGPU_MEMORY_LIMIT`, `FGPU_COMPUTE_SHARE`)
//! that the CDI spec's createRuntime hook turns into the container's limit, held by the agent.
//!
//! Each resource also hands out the node spec's grant device (`device-plugin-memory`,
//! `device-plugin-compute`): the kubelet merges the two resources' answers variable by
//! variable, the first it meets winning, so neither can set the other's variable, and a
//! container could add the variable of a resource it did not ask for. The grant devices tell
//! the hook, through config.json's hooks, what was asked: a container asking compute only
//! gets the hook's `--default-memory` and cannot give itself a memory limit; one asking memory
//! only gets no compute share and cannot give itself one (cdi/hook.rs).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::pin::Pin;

use fgpu_kubelet_api::deviceplugin::v1beta1 as dp;
use tonic::{Request, Response, Status};

/// What one resource counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Bytes per unit.
    Memory(u64),
    /// One percent of compute.
    Compute,
}

/// One resource: its unit devices by ID (`gpu<index>-<m|c><n>`) and the GPUs' UUIDs.
#[derive(Debug, Clone)]
pub struct Resource {
    pub name: String,
    pub unit: Unit,
    /// (GPU index, UUID, units on it).
    pub gpus: Vec<(u32, String, u64)>,
    /// The CDI kind of fgpu's node spec (`fgpu cdi generate`'s devices KIND=UUID).
    pub cdi_kind: String,
}

impl Resource {
    fn letter(&self) -> char {
        match self.unit {
            Unit::Memory(_) => 'm',
            Unit::Compute => 'c',
        }
    }

    pub fn device_ids(&self) -> Vec<String> {
        let l = self.letter();
        self.gpus
            .iter()
            .flat_map(|(i, _, n)| (0..*n).map(move |k| format!("gpu{i}-{l}{k}")))
            .collect()
    }

    /// The GPU index of a unit device ID (one of ours, or None).
    fn gpu_of(&self, id: &str) -> Option<u32> {
        let (g, rest) = id.strip_prefix("gpu")?.split_once('-')?;
        let k: u64 = rest.strip_prefix(self.letter())?.parse().ok()?;
        let i: u32 = g.parse().ok()?;
        self.gpus
            .iter()
            .find(|(x, _, n)| *x == i && k < *n)
            .map(|_| i)
    }

    /// A container's answer for `ids`, or why not.
    pub fn allocate(&self, ids: &[String]) -> Result<dp::ContainerAllocateResponse, String> {
        let mut gpu = None;
        for id in ids {
            let g = self.gpu_of(id).ok_or_else(|| {
                format!("{}: {id:?} is not one of this plugin's devices", self.name)
            })?;
            if gpu.is_some_and(|x| x != g) {
                return Err(format!(
                    "{}: the {} units asked for span GPUs {} and {g}; fgpu gives a container a \
                     share of one GPU (ask for fewer units, or use the DRA driver)",
                    self.name,
                    ids.len(),
                    gpu.unwrap_or(g)
                ));
            }
            gpu = Some(g);
        }
        let Some(g) = gpu else {
            return Err(format!("{}: no devices asked for", self.name));
        };
        let uuid = &self
            .gpus
            .iter()
            .find(|(x, _, _)| *x == g)
            .expect("checked above")
            .1;
        let n = ids.len() as u64;
        let (var, value, grant) = match self.unit {
            Unit::Memory(b) => ("FGPU_MEMORY_LIMIT", (b * n).to_string(), "memory"),
            Unit::Compute => ("FGPU_COMPUTE_SHARE", n.min(100).to_string(), "compute"),
        };
        let grant = crate::cdi::spec::GRANT_DEVICES
            .iter()
            .find(|(_, what)| *what == grant)
            .map(|(name, _)| *name)
            .expect("a grant device per unit");
        Ok(dp::ContainerAllocateResponse {
            envs: HashMap::from([(var.to_string(), value)]),
            cdi_devices: [uuid.as_str(), grant]
                .iter()
                .map(|d| dp::CdiDevice {
                    name: format!("{}={d}", self.cdi_kind),
                })
                .collect(),
            ..Default::default()
        })
    }

    /// Up to `size` units, `must` first, all on the GPU that has the most of `available`.
    pub fn preferred(&self, available: &[String], must: &[String], size: usize) -> Vec<String> {
        let mut by_gpu: BTreeMap<u32, Vec<&String>> = BTreeMap::new();
        for id in available {
            if let Some(g) = self.gpu_of(id) {
                by_gpu.entry(g).or_default().push(id);
            }
        }
        let pinned = must.iter().find_map(|id| self.gpu_of(id));
        let best = pinned.or_else(|| by_gpu.iter().max_by_key(|(_, v)| v.len()).map(|(g, _)| *g));
        let Some(best) = best else { return Vec::new() };
        let mut out: Vec<String> = must.to_vec();
        for id in by_gpu.remove(&best).unwrap_or_default() {
            if out.len() >= size {
                break;
            }
            if !out.contains(id) {
                out.push(id.clone());
            }
        }
        out
    }
}

pub struct DevicePluginService(pub Resource);

type Stream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<dp::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl dp::device_plugin_server::DevicePlugin for DevicePluginService {
    async fn get_device_plugin_options(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<dp::DevicePluginOptions>, Status> {
        Ok(Response::new(dp::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = Stream;

    async fn list_and_watch(&self, _: Request<dp::Empty>) -> Result<Response<Stream>, Status> {
        let devices = self
            .0
            .device_ids()
            .into_iter()
            .map(|id| dp::Device {
                id,
                health: "Healthy".into(),
                topology: None,
            })
            .collect();
        let first = tokio_stream::once(Ok(dp::ListAndWatchResponse { devices }));
        // The list does not change while the plugin runs: then stay open (the kubelet takes a
        // closed stream for a plugin that went away).
        let rest = tokio_stream::pending();
        Ok(Response::new(Box::pin(tokio_stream::StreamExt::chain(
            first, rest,
        ))))
    }

    async fn get_preferred_allocation(
        &self,
        r: Request<dp::PreferredAllocationRequest>,
    ) -> Result<Response<dp::PreferredAllocationResponse>, Status> {
        let container_responses = r
            .into_inner()
            .container_requests
            .iter()
            .map(|c| dp::ContainerPreferredAllocationResponse {
                device_i_ds: self.0.preferred(
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    c.allocation_size.max(0) as usize,
                ),
            })
            .collect();
        Ok(Response::new(dp::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        r: Request<dp::AllocateRequest>,
    ) -> Result<Response<dp::AllocateResponse>, Status> {
        let mut container_responses = Vec::new();
        for c in r.into_inner().container_requests {
            let a = self.0.allocate(&c.devices_ids).map_err(|e| {
                tracing::warn!("allocate refused: {e}");
                Status::invalid_argument(e)
            })?;
            container_responses.push(a);
        }
        Ok(Response::new(dp::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<dp::PreStartContainerRequest>,
    ) -> Result<Response<dp::PreStartContainerResponse>, Status> {
        Ok(Response::new(dp::PreStartContainerResponse {}))
    }
}

/// The plugin's socket for `resource` in the kubelet's device-plugins directory.
pub fn socket_name(resource: &str) -> String {
    format!("{}.sock", resource.replace(['/', '.'], "-"))
}

/// Registers `resource` (served on `dir/socket_name`) with the kubelet at `dir/kubelet.sock`.
pub async fn register(dir: &Path, resource: &str) -> anyhow::Result<()> {
    let kubelet: PathBuf = dir.join("kubelet.sock");
    let ch = super::server::connect(&kubelet).await?;
    let mut c = dp::registration_client::RegistrationClient::new(ch);
    c.register(dp::RegisterRequest {
        version: fgpu_kubelet_api::DEVICE_PLUGIN_VERSION.into(),
        endpoint: socket_name(resource),
        resource_name: resource.to_string(),
        options: Some(dp::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }),
    })
    .await
    .map_err(|s| anyhow::anyhow!("the kubelet refused {resource}: {}", s.message()))?;
    tracing::info!(resource, "registered with the kubelet");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> Resource {
        Resource {
            name: "fgpu.io/gpu-memory".into(),
            unit: Unit::Memory(1 << 30),
            gpus: vec![(0, "GPU-a".into(), 16), (1, "GPU-b".into(), 16)],
            cdi_kind: "fgpu.io/gpu".into(),
        }
    }

    #[test]
    fn units_on_one_gpu_only() {
        let r = mem();
        assert_eq!(r.device_ids().len(), 32);
        let ids: Vec<String> = (0..8).map(|k| format!("gpu1-m{k}")).collect();
        let a = r.allocate(&ids).unwrap();
        assert_eq!(a.envs["FGPU_MEMORY_LIMIT"], (8u64 << 30).to_string());
        assert_eq!(a.cdi_devices[0].name, "fgpu.io/gpu=GPU-b");
        assert_eq!(a.cdi_devices[1].name, "fgpu.io/gpu=device-plugin-memory");
        let err = r
            .allocate(&["gpu0-m0".into(), "gpu1-m0".into()])
            .unwrap_err();
        assert!(err.contains("span GPUs"), "{err}");
        for bad in ["gpu9-m0", "gpu0-m16", "gpu0-c1", "x", "gpu0-m-1"] {
            assert!(
                r.allocate(&[bad.into()])
                    .unwrap_err()
                    .contains("not one of"),
                "{bad}"
            );
        }
        let avail: Vec<String> = ["gpu0-m0", "gpu1-m0", "gpu1-m1", "gpu1-m2"]
            .map(String::from)
            .to_vec();
        assert_eq!(r.preferred(&avail, &[], 2), ["gpu1-m0", "gpu1-m1"]);
        assert_eq!(r.preferred(&avail, &["gpu0-m0".into()], 2), ["gpu0-m0"]);
    }
}
