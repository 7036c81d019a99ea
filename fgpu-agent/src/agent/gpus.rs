//! The GPUs of the node, as NVML reports them (the simulated NVML under `--sim`), or ROCm
//! SMI on a node without NVML (AMD GPUs, [`super::smi`]).

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
    nvml: Option<Nvml>,
}

impl Gpus {
    /// Opens NVML (`lib` overrides where libnvidia-ml.so.1 is loaded from) and lists the
    /// devices. Without NVML (no NVIDIA driver, an AMD node) the devices come from ROCm SMI
    /// (`librocm_smi64.so`, from `lib`'s directory if given); without either the list is
    /// empty and the agent still attributes memory; checks that need device sizes are then
    /// skipped.
    pub fn open(lib: Option<&Path>) -> Self {
        let mut builder = Nvml::builder();
        if let Some(lib) = lib {
            builder.lib_path(lib.as_os_str());
        }
        let nvml = match builder.init() {
            Ok(nvml) => nvml,
            Err(err) => {
                let smi = lib.and_then(Path::parent).map(super::smi::lib_in);
                return Self {
                    devices: super::smi::discover(&err.to_string(), smi.as_deref()),
                    nvml: None,
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
        Self {
            devices,
            nvml: Some(nvml),
        }
    }

    /// NVML's per-process SM utilisation, percent, summed over devices: for each process the
    /// mean of the samples NVML kept since `since_us` (CPU time, µs since the epoch). The
    /// compute controller's cross-check; empty where NVML does not support it.
    pub fn process_sm_util(&self, since_us: u64) -> Vec<(u32, f64)> {
        let Some(nvml) = &self.nvml else {
            return Vec::new();
        };
        let mut samples = Vec::new();
        for g in &self.devices {
            let Ok(d) = nvml.device_by_index(g.index) else {
                continue;
            };
            if let Ok(s) = d.process_utilization_stats(since_us) {
                samples.extend(s.into_iter().map(|s| (g.index, s.pid, s.sm_util)));
            }
        }
        mean_per_process(&samples)
    }

    /// NVML's device utilisation (percent of the last sample period in which a kernel ran),
    /// per device as (uuid key of the ledgers, percent); empty without NVML, devices whose
    /// figure NVML cannot give left out. The compute controller's idle gate
    /// (`compute::sched::probe`).
    pub fn device_busy_pct(&self) -> Vec<(u64, u32)> {
        let Some(nvml) = &self.nvml else {
            return Vec::new();
        };
        self.devices
            .iter()
            .filter_map(|g| {
                let key = fgpu_common::ledger::uuid_key(&uuid_bytes(&g.uuid)?);
                let d = nvml.device_by_index(g.index).ok()?;
                Some((key, d.utilization_rates().ok()?.gpu))
            })
            .collect()
    }

    /// NVML's per-process device memory: (NVML index, host PID, bytes), for every device
    /// (see [`super::devmap`]). Empty without NVML; processes whose figure NVML cannot give
    /// are left out.
    pub fn process_memory(&self) -> Vec<(u32, u32, u64)> {
        use nvml_wrapper::enums::device::UsedGpuMemory;
        let Some(nvml) = &self.nvml else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for g in &self.devices {
            let Ok(procs) = nvml
                .device_by_index(g.index)
                .and_then(|d| d.running_compute_processes())
            else {
                continue;
            };
            out.extend(procs.into_iter().filter_map(|p| match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some((g.index, p.pid, b)),
                UsedGpuMemory::Unavailable => None,
            }));
        }
        out
    }

    /// NVML's free memory on the GPU whose UUID is `uuid` (None: unknown GPU, or no NVML).
    pub fn free_memory(&self, uuid: &[u8; 16]) -> Option<u64> {
        let nvml = self.nvml.as_ref()?;
        let g = self
            .devices
            .iter()
            .find(|g| uuid_bytes(&g.uuid).as_ref() == Some(uuid))?;
        Some(nvml.device_by_index(g.index).ok()?.memory_info().ok()?.free)
    }

    /// The memory of the GPU whose UUID is `uuid` (None: no such GPU here).
    pub fn memory_of(&self, uuid: &[u8; 16]) -> Option<u64> {
        self.devices
            .iter()
            .find(|g| uuid_bytes(&g.uuid).as_ref() == Some(uuid))
            .map(|g| g.memory_total_bytes)
    }

    /// The largest device's memory, if any device is known.
    pub fn largest_memory(&self) -> Option<u64> {
        self.devices.iter().map(|g| g.memory_total_bytes).max()
    }
}

/// (device, pid, sm %) samples → (pid, mean over each device's samples, summed over devices).
fn mean_per_process(samples: &[(u32, u32, u32)]) -> Vec<(u32, f64)> {
    let mut per: std::collections::BTreeMap<(u32, u32), (f64, u32)> = Default::default();
    for &(dev, pid, sm) in samples {
        let e = per.entry((pid, dev)).or_default();
        e.0 += f64::from(sm);
        e.1 += 1;
    }
    let mut out: std::collections::BTreeMap<u32, f64> = Default::default();
    for ((pid, _), (sum, n)) in per {
        *out.entry(pid).or_default() += sum / f64::from(n);
    }
    out.into_iter().collect()
}

/// The 16 bytes of an NVML UUID string (`GPU-5e1a0000-0000-...`), or of ROCm's form
/// (`GPU-` + 16 hex digits of the unique id: its 16 ASCII characters, lowercase, as
/// `hipDeviceGetUuid` returns them; [`super::smi`]).
pub fn uuid_bytes(nvml_uuid: &str) -> Option<[u8; 16]> {
    let body = nvml_uuid.trim_start_matches("GPU-");
    if body.len() == 16 && body.bytes().all(|b| b.is_ascii_hexdigit()) {
        let mut out = [0u8; 16];
        out.copy_from_slice(body.to_ascii_lowercase().as_bytes());
        return Some(out);
    }
    let hex: String = body.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_uuid_strings() {
        let b = uuid_bytes("GPU-5e1a0000-0000-0000-0000-0000000000ff").unwrap();
        assert_eq!(b[0], 0x5e);
        assert_eq!(b[15], 0xff);
        assert_eq!(uuid_bytes("GPU-zz"), None);
    }

    #[test]
    fn per_process_means_are_summed_over_devices() {
        let samples = [(0, 10, 30), (0, 10, 40), (1, 10, 20), (0, 11, 90)];
        assert_eq!(mean_per_process(&samples), vec![(10, 55.0), (11, 90.0)]);
        assert!(mean_per_process(&[]).is_empty());
    }
}
