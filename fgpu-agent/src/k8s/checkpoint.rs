//! The plugin's checkpoint: the claims it prepared, in a JSON file in the agent's state
//! directory, written atomically before a prepare answers. A restarted plugin reads it back:
//! a claim prepared before the restart is answered from it (the same CDI ids, its limits put
//! back), never prepared twice, and unprepared even if the API server has forgotten it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::claim::Plan;

const VERSION: u32 = 1;

/// A prepared claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prepared {
    pub plan: Plan,
    /// The CDI ids returned to the kubelet.
    pub cdi_ids: Vec<String>,
    /// The claim's CDI spec file.
    pub spec_file: PathBuf,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    version: u32,
    /// By claim UID.
    claims: BTreeMap<String, Prepared>,
}

#[derive(Debug)]
pub struct Checkpoint {
    path: PathBuf,
    pub claims: BTreeMap<String, Prepared>,
}

impl Checkpoint {
    /// Reads `path` (none yet: empty). A file that is not ours refuses to start, rather than
    /// forget claims that hold limits.
    pub fn load(path: &Path) -> Result<Self> {
        let claims = match std::fs::read(path) {
            Ok(bytes) => {
                let f: File = serde_json::from_slice(&bytes).with_context(|| {
                    format!(
                        "{} is not a valid checkpoint (move it away to start afresh)",
                        path.display()
                    )
                })?;
                if f.version != VERSION {
                    bail!(
                        "{}: checkpoint version {} is not {VERSION}",
                        path.display(),
                        f.version
                    );
                }
                f.claims
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        Ok(Self {
            path: path.to_path_buf(),
            claims,
        })
    }

    pub fn save(&self) -> Result<()> {
        let f = File {
            version: VERSION,
            claims: self.claims.clone(),
        };
        let mut json = serde_json::to_vec_pretty(&f)?;
        json.push(b'\n');
        crate::cdi::generate::write_file(&self.path, &json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusal() {
        let dir = std::env::temp_dir().join(format!("fgpu-ckpt-{}", std::process::id()));
        let path = dir.join("claims.json");
        let mut c = Checkpoint::load(&path).unwrap();
        assert!(c.claims.is_empty());
        c.claims.insert(
            "u1".into(),
            Prepared {
                plan: Plan {
                    uid: "u1".into(),
                    namespace: "ns".into(),
                    name: "c".into(),
                    pool: "p".into(),
                    device: "gpu-0".into(),
                    requests: vec!["gpu".into()],
                    memory_bytes: Some(1 << 30),
                    compute_pct: Some(30),
                    pods: vec!["aa".into()],
                    pod_names: BTreeMap::new(),
                    park_after_ms: Some(30_000),
                },
                cdi_ids: vec!["fgpu.io/claim=u1".into()],
                spec_file: dir.join("x.json"),
            },
        );
        c.save().unwrap();
        assert_eq!(Checkpoint::load(&path).unwrap().claims, c.claims);
        // A checkpoint written before parking (no `park_after_ms`) reads as not parkable.
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(r#""park_after_ms": 30000"#), "{text}");
        let old = text.replace(r#""park_after_ms": 30000"#, r#""written_before": 0"#);
        std::fs::write(&path, old).unwrap();
        let back = Checkpoint::load(&path).unwrap();
        assert_eq!(back.claims["u1"].plan.park_after_ms, None);
        std::fs::write(&path, b"{").unwrap();
        assert!(
            Checkpoint::load(&path)
                .unwrap_err()
                .to_string()
                .contains("not a valid checkpoint")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
