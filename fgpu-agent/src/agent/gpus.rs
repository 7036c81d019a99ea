//! The GPUs of the node, as NVML reports them (the simulated NVML under `--sim`).

use std::path::Path;

use nvml_wrapper::Nvml;

/// One device.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Gpu {
    /// NVML index (physical order, not CUDA_VISIBLE_DEVICES order).
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total_bytes: u64,
}

pub struct Gpus {
    pub devices: Vec<Gpu>,
}

impl Gpus {
    /// Opens NVML (`lib` overrides where libnvidia-ml.so.1 is loaded from) and lists the
    /// devices. Without NVML (no NVIDIA driver, an AMD node) the list is empty and the
    /// agent still attributes memory; checks that need device sizes are then skipped.
    pub fn open(lib: Option<&Path>) -> Self {
        let mut builder = Nvml::builder();
        if let Some(lib) = lib {
            builder.lib_path(lib.as_os_str());
        }
        let nvml = match builder.init() {
            Ok(nvml) => nvml,
            Err(err) => {
                tracing::warn!("NVML unavailable ({err}): device sizes unknown");
                return Self {
                    devices: Vec::new(),
                };
            }
        };
        let count = nvml.device_count().unwrap_or(0);
        let devices = (0..count)
            .filter_map(|index| {
                let d = nvml.device_by_index(index).ok()?;
                Some(Gpu {
                    index,
                    uuid: d.uuid().unwrap_or_default(),
                    name: d.name().unwrap_or_default(),
                    memory_total_bytes: d.memory_info().ok()?.total,
                })
            })
            .collect::<Vec<_>>();
        for g in &devices {
            tracing::info!(index = g.index, uuid = %g.uuid, name = %g.name, memory = g.memory_total_bytes, "GPU");
        }
        Self { devices }
    }

    /// The largest device's memory, if any device is known.
    pub fn largest_memory(&self) -> Option<u64> {
        self.devices.iter().map(|g| g.memory_total_bytes).max()
    }
}
