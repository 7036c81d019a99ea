//! The node's AMD GPUs through ROCm SMI (`librocm_smi64.so`), where NVML is absent: count,
//! name, unique id and VRAM size, so that `fgpu status`, the metrics and the per-device
//! budgets know the devices.
//!
//! A device's UUID is ROCm's own form, `GPU-` and the 16 lowercase hex digits of its unique
//! id (what the HSA runtime reports as the agent's UUID and `HIP_VISIBLE_DEVICES` accepts);
//! its 16 bytes ([`super::gpus::uuid_bytes`]) are those 16 ASCII digits, which is what
//! `hipDeviceGetUuid` returns on ROCm, so the shim's HIP device records and the agent's
//! devices are the same records.

use std::ffi::{c_char, c_int};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::gpus::Gpu;

/// Where ROCm SMI is looked for, in order (the loader's path, then ROCm's default prefix).
const NAMES: [&str; 5] = [
    "librocm_smi64.so",
    "librocm_smi64.so.7",
    "librocm_smi64.so.6",
    "librocm_smi64.so.5",
    "/opt/rocm/lib/librocm_smi64.so",
];
const RSMI_MEM_TYPE_VRAM: c_int = 0;

/// ROCm SMI in directory `dir` (the simulator's directory under `--sim`).
pub fn lib_in(dir: &Path) -> PathBuf {
    dir.join(NAMES[0])
}

/// The devices ROCm SMI lists (`lib`: this library file instead of the default names);
/// empty, with one warning naming both causes, if there is none.
pub fn discover(nvml_err: &str, lib: Option<&Path>) -> Vec<Gpu> {
    match list(lib) {
        Ok(devices) => {
            for g in &devices {
                tracing::info!(index = g.index, uuid = %g.uuid, name = %g.name, memory = g.memory_total_bytes, source = "rocm_smi", "GPU");
            }
            if devices.is_empty() {
                tracing::warn!(
                    "NVML unavailable ({nvml_err}) and ROCm SMI lists no device: device sizes unknown"
                );
            }
            devices
        }
        Err(e) => {
            tracing::warn!(
                "NVML unavailable ({nvml_err}), ROCm SMI too ({e:#}): device sizes unknown"
            );
            Vec::new()
        }
    }
}

fn open(lib: Option<&Path>) -> Result<libloading::Library> {
    let candidates: Vec<PathBuf> = match lib {
        Some(p) => vec![p.to_path_buf()],
        None => NAMES.iter().map(PathBuf::from).collect(),
    };
    let mut last = None;
    for c in &candidates {
        // SAFETY: loading ROCm SMI runs its initialisers; it is a vendor library meant to be
        // loaded by monitoring tools, and nothing else of ours depends on its state.
        match unsafe { libloading::Library::new(c) } {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    match last {
        Some(e) => Err(e).context("loading librocm_smi64.so"),
        None => bail!("no ROCm SMI library to try"),
    }
}

type Init = unsafe extern "C" fn(u64) -> c_int;
type Count = unsafe extern "C" fn(*mut u32) -> c_int;
type Name = unsafe extern "C" fn(u32, *mut c_char, usize) -> c_int;
type UniqueId = unsafe extern "C" fn(u32, *mut u64) -> c_int;
type MemTotal = unsafe extern "C" fn(u32, c_int, *mut u64) -> c_int;

/// `rsmi_*` of `l` by name, with the type it has in ROCm SMI's header.
fn sym<T: Copy>(l: &libloading::Library, name: &str) -> Result<T> {
    let c = format!("{name}\0");
    // SAFETY: each name below is looked up with the C signature ROCm SMI declares for it.
    let s = unsafe { l.get::<T>(c.as_bytes()) }.with_context(|| format!("no {name}"))?;
    Ok(*s)
}

fn list(lib: Option<&Path>) -> Result<Vec<Gpu>> {
    let l = open(lib)?;
    let init: Init = sym(&l, "rsmi_init")?;
    let count: Count = sym(&l, "rsmi_num_monitor_devices")?;
    let name: Name = sym(&l, "rsmi_dev_name_get")?;
    let unique: UniqueId = sym(&l, "rsmi_dev_unique_id_get")?;
    let total: MemTotal = sym(&l, "rsmi_dev_memory_total_get")?;
    // SAFETY: rsmi_init(uint64_t flags), no pointers.
    let rc = unsafe { init(0) };
    if rc != 0 {
        bail!("rsmi_init: status {rc}");
    }
    let mut n = 0u32;
    // SAFETY: rsmi_num_monitor_devices(uint32_t *), a valid out-pointer.
    let rc = unsafe { count(&mut n) };
    if rc != 0 {
        bail!("rsmi_num_monitor_devices: status {rc}");
    }
    let mut out = Vec::new();
    for dv in 0..n.min(64) {
        let mut id = 0u64;
        // SAFETY: rsmi_dev_unique_id_get(uint32_t, uint64_t *), a valid out-pointer.
        if unsafe { unique(dv, &mut id) } != 0 {
            tracing::warn!(
                index = dv,
                "ROCm SMI has no unique id for this device: not listed"
            );
            continue;
        }
        let mut buf = [0 as c_char; 256];
        // SAFETY: rsmi_dev_name_get(uint32_t, char *, size_t) with the buffer's length.
        let named = unsafe { name(dv, buf.as_mut_ptr(), buf.len()) } == 0;
        buf[buf.len() - 1] = 0;
        let device_name = if named {
            // SAFETY: NUL-terminated (the last byte is forced to NUL above).
            unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        } else {
            String::new()
        };
        let mut bytes = 0u64;
        // SAFETY: rsmi_dev_memory_total_get(uint32_t, rsmi_memory_type_t, uint64_t *).
        let sized = unsafe { total(dv, RSMI_MEM_TYPE_VRAM, &mut bytes) } == 0;
        out.push(Gpu {
            index: dv,
            uuid: uuid_of(id),
            name: device_name,
            memory_total_bytes: if sized { bytes } else { 0 },
        });
    }
    Ok(out)
}

/// ROCm's UUID string of a device with unique id `id`.
pub fn uuid_of(id: u64) -> String {
    format!("GPU-{id:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rocm_uuids_are_the_hex_of_the_unique_id_and_bind_as_hip_reports_them() {
        let u = uuid_of(0xabcd_0123_4567_89ef);
        assert_eq!(u, "GPU-abcd0123456789ef");
        assert_eq!(
            super::super::gpus::uuid_bytes(&u),
            Some(*b"abcd0123456789ef"),
            "the bytes hipDeviceGetUuid returns on ROCm"
        );
    }

    #[test]
    fn a_missing_library_is_an_empty_list() {
        assert!(discover("test", Some(Path::new("/nonexistent/librocm_smi64.so"))).is_empty());
    }
}
