//! `CUDA_VISIBLE_DEVICES`: which physical devices a process's CUDA ordinals name, in which
//! order. NVML ignores it (it always lists every physical device by its NVML index), as the
//! real NVML does.
//!
//! Like the real driver, the list is read once (at the first `cuInit`), entries are separated
//! by commas and may be surrounded by blanks, and enumeration stops at the first entry that
//! names no device: `0,7,1` on a two-device node makes only device 0 visible. An entry is
//! - a physical index (`1`);
//! - a device UUID with its `GPU-` prefix, or a prefix of one that matches exactly one device
//!   (`GPU-5e1a0000-0000-0000-0000-000000000001`);
//! - a MIG device UUID (`MIG-...`): the simulator has no MIG instances, so it stops there and
//!   says so on stderr.
//!
//! A device named twice also stops enumeration. Unset: every device, in physical order; set
//! but naming no device (empty, `-1`, `none`): no device, and `cuInit` returns
//! `CUDA_ERROR_NO_DEVICE`.

use std::sync::OnceLock;

/// Physical device indices, in CUDA ordinal order, for `spec` (the variable's value, `None`
/// when unset) on a node whose devices have the UUID strings `uuids` (NVML form, `GPU-...`).
/// The second value explains where enumeration stopped early, if it did.
pub fn parse(spec: Option<&str>, uuids: &[String]) -> (Vec<usize>, Option<String>) {
    let Some(spec) = spec else {
        return ((0..uuids.len()).collect(), None);
    };
    let mut out: Vec<usize> = Vec::new();
    for raw in spec.split(',') {
        let entry = raw.trim();
        let found = match resolve(entry, uuids) {
            Ok(d) if out.contains(&d) => Err(format!("'{entry}' names device {d} a second time")),
            other => other,
        };
        match found {
            Ok(d) => out.push(d),
            Err(why) => {
                let why = (!entry.is_empty()).then(|| {
                    format!(
                        "CUDA_VISIBLE_DEVICES={spec}: {why}; devices from this entry on are not visible"
                    )
                });
                return (out, why);
            }
        }
    }
    (out, None)
}

fn resolve(entry: &str, uuids: &[String]) -> Result<usize, String> {
    if entry.is_empty() {
        return Err("empty entry".into());
    }
    if entry.len() >= 4 && entry[..4].eq_ignore_ascii_case("MIG-") {
        return Err(format!(
            "'{entry}' is a MIG device UUID; the simulator has no MIG instances (MIG is not supported)"
        ));
    }
    if entry.bytes().all(|b| b.is_ascii_digit()) {
        return entry
            .parse::<usize>()
            .ok()
            .filter(|&d| d < uuids.len())
            .ok_or_else(|| format!("'{entry}' is not a device index (0-{})", uuids.len() - 1));
    }
    if entry.len() > 4 && entry[..4].eq_ignore_ascii_case("GPU-") {
        let matches: Vec<usize> = (0..uuids.len())
            .filter(|&d| {
                uuids[d].len() >= entry.len() && uuids[d][..entry.len()].eq_ignore_ascii_case(entry)
            })
            .collect();
        return match matches.as_slice() {
            [d] => Ok(*d),
            [] => Err(format!("'{entry}' matches no device UUID")),
            _ => Err(format!("'{entry}' matches {} device UUIDs", matches.len())),
        };
    }
    Err(format!(
        "'{entry}' is neither a device index nor a GPU-/MIG- UUID"
    ))
}

static MAP: OnceLock<Vec<usize>> = OnceLock::new();

/// This process's ordinal → physical map, computed on first use for a node of `devices`
/// devices (a note goes to stderr once if the variable stops enumeration early).
pub fn map(devices: usize) -> &'static [usize] {
    MAP.get_or_init(|| {
        let uuids: Vec<String> = (0..devices).map(crate::nvml::uuid_string).collect();
        let spec = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let (m, why) = parse(spec.as_deref(), &uuids);
        if let Some(why) = why {
            eprintln!("fgpu-sim: {why}");
        }
        m
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uuids(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("GPU-5e1a0000-0000-0000-0000-0000000000{i:02x}"))
            .collect()
    }

    #[test]
    fn unset_is_every_device_in_order() {
        assert_eq!(parse(None, &uuids(4)).0, vec![0, 1, 2, 3]);
    }

    #[test]
    fn indices_reorder_and_select() {
        assert_eq!(parse(Some("1"), &uuids(2)), (vec![1], None));
        assert_eq!(parse(Some("1,0"), &uuids(2)), (vec![1, 0], None));
        assert_eq!(parse(Some(" 3 , 1"), &uuids(4)), (vec![3, 1], None));
    }

    #[test]
    fn uuids_and_unique_prefixes() {
        let u = uuids(4);
        let full = format!("GPU-{}", u[2][4..].to_uppercase());
        assert_eq!(parse(Some(&full), &u).0, vec![2]);
        assert_eq!(
            parse(Some("gpu-5e1a0000-0000-0000-0000-00000000000"), &u).0,
            Vec::<usize>::new()
        );
        let (m, why) = parse(Some("0,GPU-5e1a"), &u);
        assert_eq!(m, vec![0]);
        assert!(why.unwrap().contains("matches 4 device UUIDs"));
        assert_eq!(parse(Some(&format!("{},0", u[3])), &u).0, vec![3, 0]);
    }

    #[test]
    fn enumeration_stops_at_the_first_bad_entry() {
        let u = uuids(2);
        let (m, why) = parse(Some("0,7,1"), &u);
        assert_eq!(m, vec![0]);
        assert!(why.unwrap().contains("'7' is not a device index (0-1)"));
        let (m, why) = parse(Some("1,1,0"), &u);
        assert_eq!(m, vec![1]);
        assert!(why.unwrap().contains("a second time"));
        assert_eq!(parse(Some("-1"), &u).0, Vec::<usize>::new());
        assert_eq!(parse(Some(""), &u), (vec![], None));
    }

    #[test]
    fn mig_uuids_are_reported_unsupported() {
        let (m, why) = parse(Some("MIG-4f1b2c3d-0000-0000-0000-000000000000"), &uuids(2));
        assert!(m.is_empty());
        assert!(why.unwrap().contains("MIG is not supported"));
    }
}
