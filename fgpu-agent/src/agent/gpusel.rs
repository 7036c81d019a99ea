//! Resolving the GPUs a user names (`fgpu limit set|rm --gpu X`) to the NVML UUIDs that
//! per-GPU limits are kept by.
//!
//! `X` is an NVML index (`0`: physical order, not a process's `CUDA_VISIBLE_DEVICES`
//! order), a full UUID (`GPU-5e1a...`) or a prefix of one that only one GPU of the node has
//! (with or without `GPU-`, any case). MIG instances (`MIG-...`) have no limits of their
//! own: they are refused, naming the GPUs that can be given instead. An unknown or ambiguous
//! GPU is an error that lists the node's GPUs.

use anyhow::{Result, bail};

use super::gpus::Gpu;

/// The UUID of the GPU `given` names (see the module documentation).
pub fn resolve(devices: &[Gpu], given: &str) -> Result<String> {
    let g = given.trim();
    if g.is_empty() {
        bail!(
            "--gpu needs a GPU: an index or a UUID; this node has {}",
            list(devices)
        );
    }
    let lower = g.to_ascii_lowercase();
    if lower.starts_with("mig-") {
        bail!(
            "--gpu {g}: MIG instances are not supported (limits are per physical GPU); give \
             the GPU's index or UUID: this node has {}",
            list(devices)
        );
    }
    if g.bytes().all(|b| b.is_ascii_digit()) {
        return match g
            .parse::<u32>()
            .ok()
            .and_then(|i| devices.iter().find(|d| d.index == i))
        {
            Some(d) => Ok(d.uuid.clone()),
            None => bail!(
                "--gpu {g}: no GPU of index {g}; this node has {}",
                list(devices)
            ),
        };
    }
    let want = lower.strip_prefix("gpu-").unwrap_or(&lower);
    let matches: Vec<&Gpu> = devices
        .iter()
        .filter(|d| {
            let u = d.uuid.to_ascii_lowercase();
            u.strip_prefix("gpu-").unwrap_or(&u).starts_with(want)
        })
        .collect();
    match matches.as_slice() {
        [one] => Ok(one.uuid.clone()),
        [] => bail!(
            "--gpu {g}: no GPU has this UUID; this node has {}",
            list(devices)
        ),
        several => bail!(
            "--gpu {g} is ambiguous: it matches {}; give more of the UUID, or the index",
            list_of(several.iter().copied())
        ),
    }
}

/// The UUIDs of every GPU in `given`, in order, without repeats.
pub fn resolve_all<'a>(
    devices: &[Gpu],
    given: impl IntoIterator<Item = &'a String>,
) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for g in given {
        let uuid = resolve(devices, g)?;
        if !out.contains(&uuid) {
            out.push(uuid);
        }
    }
    Ok(out)
}

/// How a GPU is named to people: `GPU 1 (GPU-5e1a..., NAME)`, or its UUID if the node no
/// longer has it.
pub fn describe(devices: &[Gpu], uuid: &str) -> String {
    devices
        .iter()
        .find(|d| d.uuid == uuid)
        .map_or_else(|| format!("{uuid} (not on this node)"), one)
}

fn one(d: &Gpu) -> String {
    format!("GPU {} ({}, {})", d.index, d.uuid, d.name)
}

fn list_of<'a>(devices: impl Iterator<Item = &'a Gpu>) -> String {
    devices.map(one).collect::<Vec<_>>().join(", ")
}

fn list(devices: &[Gpu]) -> String {
    if devices.is_empty() {
        "no GPU that NVML lists (per-GPU limits need NVML)".to_string()
    } else {
        list_of(devices.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus() -> Vec<Gpu> {
        [
            "GPU-5e1a0000-0000-0000-0000-000000000000",
            "GPU-5e1a0000-0000-0000-0000-000000000001",
            "GPU-77aa0000-0000-0000-0000-000000000002",
        ]
        .iter()
        .enumerate()
        .map(|(i, u)| Gpu {
            index: i as u32,
            uuid: (*u).to_string(),
            name: "Sim".into(),
            memory_total_bytes: 16 << 30,
        })
        .collect()
    }

    #[test]
    fn indices_uuids_and_unique_prefixes_resolve() {
        let d = gpus();
        assert_eq!(resolve(&d, "1").unwrap(), d[1].uuid);
        assert_eq!(resolve(&d, &d[0].uuid).unwrap(), d[0].uuid);
        assert_eq!(resolve(&d, "gpu-77").unwrap(), d[2].uuid);
        assert_eq!(resolve(&d, "77AA").unwrap(), d[2].uuid);
        assert_eq!(
            resolve(&d, "GPU-5e1a0000-0000-0000-0000-00000000000")
                .unwrap_err()
                .to_string(),
            format!(
                "--gpu GPU-5e1a0000-0000-0000-0000-00000000000 is ambiguous: it matches GPU 0 ({}, Sim), GPU 1 ({}, Sim); give more of the UUID, or the index",
                d[0].uuid, d[1].uuid
            )
        );
        assert_eq!(
            resolve_all(&d, &["1".to_string(), d[1].uuid.clone(), "0".into()]).unwrap(),
            [d[1].uuid.clone(), d[0].uuid.clone()]
        );
    }

    #[test]
    fn unknown_mig_and_empty_are_errors_that_name_the_gpus() {
        let d = gpus();
        for (given, says) in [
            ("5", "no GPU of index 5"),
            (
                "MIG-5e1a0000-0000-0000-0000-000000000001",
                "MIG instances are not supported",
            ),
            ("GPU-ffff", "no GPU has this UUID"),
            ("", "needs a GPU"),
        ] {
            let err = resolve(&d, given).unwrap_err().to_string();
            assert!(err.contains(says), "{given}: {err}");
            assert!(err.contains("GPU 2 (GPU-77aa"), "{given}: {err}");
            assert!(!err.contains('\n'), "one line: {err}");
        }
        let err = resolve(&[], "0").unwrap_err().to_string();
        assert!(err.contains("no GPU that NVML lists"), "{err}");
    }
}
