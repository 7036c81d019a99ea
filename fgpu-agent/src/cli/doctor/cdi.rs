//! fgpu's CDI node spec (what `fgpu cdi generate` writes, `crate::cdi::spec`): present in a
//! directory the runtimes read, and current — every host path it mounts and every device node
//! it names exists, its hook is there and runs an fgpu that exists, it points at this agent's
//! sockets, and it lists the GPUs NVML sees now.

use std::path::{Path, PathBuf};

use crate::cdi::spec::{self, Spec};

use super::{Check, Paths};

const NAME: &str = "cdi-spec";

pub fn checks(p: &Paths, gpus: Option<&[String]>) -> Vec<Check> {
    let mut found = Vec::new();
    for dir in &p.cdi_dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|f| f.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        found.extend(files.into_iter().filter_map(|f| read(p, &f)));
    }
    if found.is_empty() {
        let dirs: Vec<String> = p.cdi_dirs.iter().map(|d| d.display().to_string()).collect();
        return vec![Check::warn(
            NAME,
            format!(
                "no CDI spec of kind {} in {}: containers cannot ask for `--device {}=0`",
                p.cdi_kind,
                dirs.join(", "),
                p.cdi_kind
            ),
            format!(
                "write it: `sudo fgpu cdi generate{} --output /etc/cdi/fgpu.json`",
                p.sim_flag()
            ),
        )];
    }
    found
        .into_iter()
        .map(|(path, spec)| match spec {
            Ok(spec) => current(p, &path, &spec, gpus),
            Err(err) => Check::fail(
                NAME,
                format!(
                    "{}: kind {}, but not a spec this fgpu reads ({err})",
                    path.display(),
                    p.cdi_kind
                ),
                regenerate(p, &path),
            ),
        })
        .collect()
}

/// `path` if it is a JSON spec of fgpu's kind: the spec, or why it does not parse.
fn read(p: &Paths, path: &Path) -> Option<(PathBuf, Result<Spec, String>)> {
    let text = std::fs::read(path).ok()?;
    let value: serde_json::Value = serde_json::from_slice(&text).ok()?;
    if value.get("kind").and_then(|k| k.as_str()) != Some(p.cdi_kind.as_str()) {
        return None;
    }
    let spec = serde_json::from_value::<Spec>(value).map_err(|e| e.to_string());
    Some((path.to_path_buf(), spec))
}

fn regenerate(p: &Paths, path: &Path) -> String {
    format!(
        "regenerate it, with the options it was made with: `sudo fgpu cdi generate{} --output {}`",
        p.sim_flag(),
        path.display()
    )
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Checks one spec against the node as it is now.
fn current(p: &Paths, path: &Path, spec: &Spec, gpus: Option<&[String]>) -> Check {
    let mut stale = Vec::new();
    let mut dated = Vec::new();
    let edits = std::iter::once(&spec.container_edits)
        .chain(spec.devices.iter().map(|d| &d.container_edits));
    for e in edits {
        for m in &e.mounts {
            if !Path::new(&m.host_path).exists() {
                stale.push(format!(
                    "names {} (mounted at {}), which does not exist",
                    m.host_path, m.container_path
                ));
            }
        }
        for n in &e.device_nodes {
            if !Path::new(&n.path).exists() {
                stale.push(format!(
                    "names device node {}, which does not exist",
                    n.path
                ));
            }
        }
    }
    let hook = spec.container_edits.hooks.iter().find(|h| {
        h.hook_name == "createRuntime" && h.args.get(1..3) == Some(&["cdi".into(), "hook".into()])
    });
    match hook {
        None => stale.push(
            "has no `fgpu cdi hook` createRuntime hook: the limits containers ask for are not \
             registered with the agent"
                .to_string(),
        ),
        Some(h) if !Path::new(&h.path).is_file() => {
            stale.push(format!("its hook runs {}, which does not exist", h.path))
        }
        Some(h) => {
            let admin = h
                .args
                .iter()
                .position(|a| a == "--admin-socket")
                .and_then(|i| h.args.get(i + 1));
            if let Some(admin) = admin
                && absolute(Path::new(admin)) != absolute(&p.admin_socket)
            {
                stale.push(format!(
                    "its hook asks the agent on {admin}, but the admin socket is {}",
                    p.admin_socket.display()
                ));
            }
        }
    }
    let socket_dir = spec
        .container_edits
        .mounts
        .iter()
        .find(|m| m.container_path == spec::SOCKET_DIR_IN_CONTAINER);
    let want_dir = p.socket.parent().map(absolute);
    match socket_dir {
        None => stale.push(format!(
            "mounts no containers' socket directory at {}",
            spec::SOCKET_DIR_IN_CONTAINER
        )),
        Some(m) if Some(absolute(Path::new(&m.host_path))) != want_dir => stale.push(format!(
            "mounts {} as the containers' socket directory, but the agent's socket is {}",
            m.host_path,
            p.socket.display()
        )),
        Some(_) => {}
    }
    let name = p.socket.file_name().map(|n| n.to_string_lossy());
    let env = spec
        .container_edits
        .env
        .iter()
        .find_map(|v| v.strip_prefix("FGPU_SOCKET="));
    if let (Some(env), Some(name)) = (env, &name)
        && Path::new(env)
            .file_name()
            .map(|n| n.to_string_lossy())
            .as_ref()
            != Some(name)
    {
        stale.push(format!(
            "sets FGPU_SOCKET={env}, but the agent's socket is named {name}"
        ));
    }
    if spec.cdi_version != spec::CDI_VERSION {
        dated.push(format!(
            "has cdiVersion {}, this fgpu writes {}",
            spec.cdi_version,
            spec::CDI_VERSION
        ));
    }
    // Devices are `all`, one per index, one per UUID and the device plugin's grants: the
    // UUIDs are the rest.
    let grants = crate::cdi::spec::GRANT_DEVICES.map(|(name, _)| name);
    let mut listed: Vec<&str> = spec
        .devices
        .iter()
        .map(|d| d.name.as_str())
        .filter(|n| *n != "all" && !n.bytes().all(|b| b.is_ascii_digit()))
        .filter(|n| !grants.contains(n))
        .collect();
    listed.sort_unstable();
    if let Some(gpus) = gpus {
        let mut seen: Vec<&str> = gpus.iter().map(String::as_str).collect();
        seen.sort_unstable();
        if listed != seen {
            dated.push(format!(
                "lists GPUs [{}], but NVML sees [{}]",
                listed.join(", "),
                seen.join(", ")
            ));
        }
    }
    if !stale.is_empty() {
        stale.extend(dated);
        return Check::fail(
            NAME,
            format!("{} is stale: it {}", path.display(), stale.join("; it ")),
            regenerate(p, path),
        );
    }
    if !dated.is_empty() {
        return Check::warn(
            NAME,
            format!(
                "{} is out of date: it {}",
                path.display(),
                dated.join("; it ")
            ),
            regenerate(p, path),
        );
    }
    let shim = spec
        .container_edits
        .mounts
        .iter()
        .find(|m| m.container_path == spec::SHIM_IN_CONTAINER)
        .map_or("no shim mount", |m| m.host_path.as_str());
    Check::ok(
        NAME,
        format!(
            "{}: current ({} GPU{}, shim {shim}, hook {})",
            path.display(),
            listed.len(),
            if listed.len() == 1 { "" } else { "s" },
            hook.map_or("-", |h| h.path.as_str())
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::super::Status;
    use super::super::tests::Tree;
    use super::*;

    const UUID: &str = "GPU-6b9a4a5e-0000-4000-8000-000000000000";

    /// The spec `fgpu cdi generate` builds for the tree's sockets, shim and fgpu binary.
    fn generated(t: &Tree, p: &Paths) -> Spec {
        let shim = t.write("/usr/lib/fgpu/libfgpu.so", "shim");
        let fgpu = t.write("/usr/bin/fgpu", "fgpu");
        t.mkdir("/run/fgpu");
        spec::build(&spec::Inputs {
            kind: spec::DEFAULT_KIND.into(),
            gpus: vec![spec::Gpu {
                index: 0,
                uuid: UUID.into(),
                minor: 0,
            }],
            shim: shim.display().to_string(),
            socket: p.socket.display().to_string(),
            preload: spec::Preload::Env,
            fgpu: fgpu.display().to_string(),
            hook_args: vec![
                "--admin-socket".into(),
                p.admin_socket.display().to_string(),
            ],
            nvidia: None,
        })
    }

    fn write(t: &Tree, path: &str, spec: &Spec) -> PathBuf {
        t.write(path, serde_json::to_vec_pretty(spec).unwrap())
    }

    #[test]
    fn a_generated_spec_is_current() {
        let t = Tree::new("cdi-ok");
        let p = t.paths();
        let spec = generated(&t, &p);
        let at = write(&t, "/etc/cdi/fgpu.json", &spec);
        // Other vendors' specs and fgpu's claim specs are not the node spec.
        t.write(
            "/etc/cdi/nvidia.json",
            r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu"}"#,
        );
        t.write("/var/run/cdi/notes.txt", "not a spec");
        let checks = checks(&p, Some(&[UUID.to_string()]));
        assert_eq!(checks.len(), 1);
        assert_eq!(checks[0].status, Status::Ok, "{:?}", checks[0]);
        assert_eq!(
            checks[0].detail,
            format!(
                "{}: current (1 GPU, shim {}, hook {})",
                at.display(),
                t.0.join("usr/lib/fgpu/libfgpu.so").display(),
                t.0.join("usr/bin/fgpu").display()
            )
        );
    }

    #[test]
    fn no_spec_is_a_warning_that_says_how_to_write_one() {
        let t = Tree::new("cdi-none");
        let mut p = t.paths();
        p.sim = true;
        let checks = checks(&p, None);
        assert_eq!(checks[0].status, Status::Warn);
        assert_eq!(
            checks[0].detail,
            format!(
                "no CDI spec of kind fgpu.io/gpu in {}, {}: containers cannot ask for \
                 `--device fgpu.io/gpu=0`",
                t.0.join("etc/cdi").display(),
                t.0.join("var/run/cdi").display()
            )
        );
        assert_eq!(
            checks[0].fix.as_deref(),
            Some("write it: `sudo fgpu cdi generate --sim --output /etc/cdi/fgpu.json`")
        );
    }

    #[test]
    fn a_missing_library_a_lost_hook_and_moved_sockets_make_it_stale() {
        let t = Tree::new("cdi-stale");
        let p = t.paths();
        let mut spec = generated(&t, &p);
        spec.container_edits.mounts.push(spec::Mount {
            host_path: "/nonexistent/libcuda.so.1".into(),
            container_path: "/usr/local/nvidia/lib64/libcuda.so.1".into(),
            options: vec!["ro".into()],
        });
        let at = write(&t, "/var/run/cdi/fgpu.io-gpu.json", &spec);
        let c = checks(&p, None).remove(0);
        assert_eq!(c.status, Status::Fail);
        assert_eq!(
            c.detail,
            format!(
                "{} is stale: it names /nonexistent/libcuda.so.1 (mounted at \
                 /usr/local/nvidia/lib64/libcuda.so.1), which does not exist",
                at.display()
            )
        );
        assert_eq!(
            c.fix,
            Some(format!(
                "regenerate it, with the options it was made with: `sudo fgpu cdi generate \
                 --output {}`",
                at.display()
            ))
        );

        let mut spec = generated(&t, &p);
        spec.container_edits.hooks.clear();
        let mut other = p.clone();
        other.socket = t.0.join("run/elsewhere/fgpu.sock");
        t.mkdir("/run/elsewhere");
        let c = current(&other, &at, &spec, None);
        assert_eq!(c.status, Status::Fail);
        assert_eq!(
            c.detail,
            format!(
                "{} is stale: it has no `fgpu cdi hook` createRuntime hook: the limits \
                 containers ask for are not registered with the agent; it mounts {} as the \
                 containers' socket directory, but the agent's socket is {}",
                at.display(),
                t.0.join("run/fgpu").display(),
                other.socket.display()
            )
        );
    }

    #[test]
    fn other_gpus_or_an_older_cdi_version_are_a_warning() {
        let t = Tree::new("cdi-dated");
        let p = t.paths();
        let mut spec = generated(&t, &p);
        spec.cdi_version = "0.3.0".into();
        let at = write(&t, "/etc/cdi/fgpu.json", &spec);
        let c = checks(&p, Some(&["GPU-new".to_string()])).remove(0);
        assert_eq!(c.status, Status::Warn);
        assert_eq!(
            c.detail,
            format!(
                "{} is out of date: it has cdiVersion 0.3.0, this fgpu writes 0.5.0; it lists \
                 GPUs [{UUID}], but NVML sees [GPU-new]",
                at.display()
            )
        );
        // Without NVML the GPUs are not compared.
        spec.cdi_version = spec::CDI_VERSION.into();
        write(&t, "/etc/cdi/fgpu.json", &spec);
        assert_eq!(checks(&p, None)[0].status, Status::Ok);
    }

    #[test]
    fn a_spec_of_our_kind_that_does_not_parse_fails() {
        let t = Tree::new("cdi-bad");
        let p = t.paths();
        let at = t.write(
            "/etc/cdi/fgpu.json",
            r#"{"kind":"fgpu.io/gpu","devices":3}"#,
        );
        let c = checks(&p, None).remove(0);
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.detail.starts_with(&format!(
                "{}: kind fgpu.io/gpu, but not a spec this fgpu reads (",
                at.display()
            )),
            "{}",
            c.detail
        );
    }
}
