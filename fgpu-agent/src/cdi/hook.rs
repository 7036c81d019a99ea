//! `fgpu cdi hook`: the OCI `createRuntime` hook of fgpu's CDI spec. The runtime (runc,
//! crun) runs it on the host after it has made the container's cgroup and namespaces and
//! before the container's program starts, with the container's state on stdin
//! (`{"ociVersion", "id", "status", "pid", "bundle", ...}`).
//!
//! It reads the container's `config.json` in the bundle, takes the limits the container asks
//! for from its environment (`FGPU_MEMORY_LIMIT`, `GPU_MEM_LIMIT_GB`, `FGPU_COMPUTE_SHARE`),
//! applies the operator's policy (`--default-memory`, `--max-memory`), and registers them
//! with the agent, over the admin socket, on the container's cgroup (the cgroup of the
//! state's `pid`), bound to the cgroup's life: the agent removes the limit when the cgroup
//! goes. From then on the limit is held by the agent (and the kernel backstop), not by the
//! environment: unsetting the variable or the preload inside the container does not raise it.
//!
//! The environment is the container's, so untrusted: a value that is not a valid limit, one
//! above `--max-memory` or `--max-compute`, or one of fgpu's variables given more than once
//! (runtimes, getenv and the shim do not agree on which occurrence counts) refuses the
//! container (the hook fails, so the runtime does not start it) with a message that says why.
//! A container that asks for nothing gets `--default-memory` when the operator set one, and
//! otherwise no limit of its own.
//!
//! Under fgpu's device plugin the kubelet sets the variables, but the container's image and
//! spec can add more, and the kubelet merges its two resources' answers by variable (each can
//! set only its own). What the container was granted is therefore read from what it cannot
//! write: the hooks of config.json. The plugin hands out, beside the GPU, the node spec's
//! device `device-plugin-memory` or `device-plugin-compute`, whose only edit is this hook with
//! `--granted memory` or `--granted compute` ([`GRANTED`]). A container with either is a
//! device-plugin container: it must have `FGPU_MEMORY_LIMIT` exactly when memory was granted
//! (else it gets `--default-memory`) and `FGPU_COMPUTE_SHARE` exactly when compute was (else
//! no share of its own); a variable for a resource it was not granted refuses it.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use clap::Args;
use fgpu_common::proto::Kind;
use fgpu_common::quantity::{Size, parse_percent, parse_size};
use serde::Deserialize;

use crate::api::{Limit, LimitEntry, LimitSetRequest};

/// The most read of the state (stdin) and of config.json.
const MAX_STATE: u64 = 1 << 20;
const MAX_CONFIG: u64 = 16 << 20;

#[derive(Debug, Args)]
pub struct HookArgs {
    /// The agent's admin socket [default: $FGPU_ADMIN_SOCKET, else /run/fgpu-admin/fgpu.sock].
    #[arg(long, value_name = "PATH")]
    pub admin_socket: Option<PathBuf>,
    /// Memory limit for containers that ask for none (no FGPU_MEMORY_LIMIT nor
    /// GPU_MEM_LIMIT_GB), e.g. 8GiB.
    #[arg(long, value_name = "SIZE", value_parser = size)]
    pub default_memory: Option<u64>,
    /// Refuse containers that ask for more than this, e.g. 40GiB.
    #[arg(long, value_name = "SIZE", value_parser = size)]
    pub max_memory: Option<u64>,
    /// Refuse containers that ask for a larger compute share (FGPU_COMPUTE_SHARE) than this
    /// percent.
    #[arg(long, value_name = "PERCENT", value_parser = clap::value_parser!(u8).range(1..=100))]
    pub max_compute: Option<u8>,
    /// What fgpu's device plugin granted (memory, compute): set by the node spec's
    /// device-plugin devices, never by hand. The hook reads every hook's grants from
    /// config.json, so its own are only a marker there.
    #[arg(long, value_name = "RESOURCE", value_parser = ["memory", "compute"])]
    pub granted: Vec<String>,
    /// Start the container when the agent cannot be reached (its shim then enforces the
    /// environment's limit on its own, with a warning) instead of refusing it.
    #[arg(long)]
    pub allow_without_agent: bool,
}

fn size(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// The part of the OCI state the hook reads.
#[derive(Debug, Deserialize)]
pub struct State {
    pub id: String,
    pub pid: Option<i64>,
    pub bundle: PathBuf,
}

/// The argument by which the node spec's device-plugin devices mark their hook.
pub const GRANTED: &str = "--granted";

/// The environment variables the hook reads: none may appear twice.
pub const VARIABLES: [&str; 4] = [
    "FGPU_MEMORY_LIMIT",
    "GPU_MEM_LIMIT_GB",
    "FGPU_COMPUTE_SHARE",
    "FGPU_PARK_AFTER",
];

/// The part of config.json the hook reads.
#[derive(Debug, Default, Deserialize)]
pub struct Config {
    #[serde(default)]
    pub process: Option<Process>,
    #[serde(default)]
    pub hooks: Option<Hooks>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Hooks {
    #[serde(default, rename = "createRuntime")]
    pub create_runtime: Vec<OciHook>,
}

#[derive(Debug, Default, Deserialize)]
pub struct OciHook {
    #[serde(default)]
    pub args: Vec<String>,
}

/// What fgpu's device plugin granted a container (from its hooks, see the module's doc).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    pub memory: bool,
    pub compute: bool,
}

impl Config {
    /// The device plugin's grants, from every createRuntime hook's `--granted` arguments;
    /// `None`: a container fgpu's device plugin did not give a GPU.
    pub fn granted(&self) -> Option<Granted> {
        let hooks = self.hooks.as_ref()?;
        let mut g = None::<Granted>;
        for h in &hooks.create_runtime {
            let mut it = h.args.iter();
            while let Some(a) = it.next() {
                let value = match a.strip_prefix(GRANTED) {
                    Some("") => it.next().map(String::as_str),
                    Some(v) => v.strip_prefix('='),
                    None => None,
                };
                match value {
                    Some("memory") => g.get_or_insert_default().memory = true,
                    Some("compute") => g.get_or_insert_default().compute = true,
                    _ => {}
                }
            }
        }
        g
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct Process {
    #[serde(default)]
    pub env: Vec<String>,
}

/// The first value of `name` in an environment list, as getenv(3) in the container sees it.
fn getenv<'a>(env: &'a [String], name: &str) -> Option<&'a str> {
    env.iter()
        .find_map(|e| e.strip_prefix(name).and_then(|rest| rest.strip_prefix('=')))
}

/// How often `name` is set in an environment list.
fn count(env: &[String], name: &str) -> usize {
    env.iter()
        .filter(|e| e.strip_prefix(name).is_some_and(|r| r.starts_with('=')))
        .count()
}

/// The limit a container's environment asks for, under the operator's policy; `granted`:
/// what fgpu's device plugin gave it, if it did ([`Config::granted`]).
pub fn limit_from_env(env: &[String], args: &HookArgs, granted: Option<Granted>) -> Result<Limit> {
    for name in VARIABLES {
        let n = count(env, name);
        if n > 1 {
            bail!(
                "{name} is set {n} times in the container's environment: fgpu takes its \
                 variables only once (an image's ENV, the pod's env and a device plugin's \
                 value would each win somewhere)"
            );
        }
    }
    if let Some(g) = granted {
        let set = |name| getenv(env, name).is_some();
        for (name, ok) in [
            ("FGPU_MEMORY_LIMIT", g.memory),
            ("GPU_MEM_LIMIT_GB", g.memory),
            ("FGPU_COMPUTE_SHARE", g.compute),
        ] {
            if set(name) && !ok {
                bail!(
                    "{name} is set in the container's environment, but fgpu's device plugin \
                     granted it no GPU {}: only the plugin sets it",
                    if name == "FGPU_COMPUTE_SHARE" {
                        "compute"
                    } else {
                        "memory"
                    }
                );
            }
        }
        for (name, ok) in [
            ("FGPU_MEMORY_LIMIT", g.memory),
            ("FGPU_COMPUTE_SHARE", g.compute),
        ] {
            if ok && !set(name) {
                bail!(
                    "fgpu's device plugin granted GPU {} but {name} is not in the \
                     container's environment",
                    if name == "FGPU_COMPUTE_SHARE" {
                        "compute"
                    } else {
                        "memory"
                    }
                );
            }
        }
    }
    let mut memory: Option<(u64, &str)> = None;
    if let Some(v) = getenv(env, "FGPU_MEMORY_LIMIT").filter(|v| !v.trim().is_empty()) {
        if v.contains(':') || v.contains(',') {
            bail!(
                "FGPU_MEMORY_LIMIT={v}: per-device lists are not taken at container creation; \
                 give one SIZE for the container (e.g. 8GiB)"
            );
        }
        let b = parse_size(v).map_err(|e| anyhow::anyhow!("FGPU_MEMORY_LIMIT={v}: {e}"))?;
        memory = Some((b, "FGPU_MEMORY_LIMIT"));
    }
    if let Some(v) = getenv(env, "GPU_MEM_LIMIT_GB").filter(|v| !v.trim().is_empty()) {
        let t = v.trim();
        if !t.bytes().all(|c| c.is_ascii_digit() || c == b'.') {
            bail!("GPU_MEM_LIMIT_GB={v}: not a number of GiB (expected e.g. 8 or 7.5)");
        }
        let b = parse_size(&format!("{t}GiB"))
            .map_err(|e| anyhow::anyhow!("GPU_MEM_LIMIT_GB={v}: {e}"))?;
        if memory.is_none_or(|(m, _)| b < m) {
            memory = Some((b, "GPU_MEM_LIMIT_GB"));
        }
    }
    let memory_bytes = match memory {
        Some((0, from)) => bail!("{from}: a limit of 0 bytes would refuse every allocation"),
        Some((b, from)) => {
            if let Some(max) = args.max_memory
                && b > max
            {
                bail!(
                    "{from} asks for {}, above this node's maximum per container ({}, the \
                     hook's --max-memory)",
                    Size(b),
                    Size(max)
                );
            }
            Some(b)
        }
        None => args.default_memory,
    };
    let compute_pct = match getenv(env, "FGPU_COMPUTE_SHARE").filter(|v| !v.trim().is_empty()) {
        Some(v) => {
            let p = parse_percent(v).map_err(|e| anyhow::anyhow!("FGPU_COMPUTE_SHARE={v}: {e}"))?;
            if !(1..=100).contains(&p) {
                bail!("FGPU_COMPUTE_SHARE={v}: give 1-100%");
            }
            if let Some(max) = args.max_compute
                && p > max
            {
                bail!(
                    "FGPU_COMPUTE_SHARE={v}: above this node's maximum per container ({max}%, \
                     the hook's --max-compute)"
                );
            }
            Some(p)
        }
        None => None,
    };
    let park_after_ms = match getenv(env, "FGPU_PARK_AFTER").filter(|v| !v.trim().is_empty()) {
        Some(v) => {
            let ms = fgpu_common::quantity::parse_duration_ms(v)
                .map_err(|e| anyhow::anyhow!("FGPU_PARK_AFTER={v}: {e}"))?;
            if ms == 0 {
                bail!(
                    "FGPU_PARK_AFTER={v}: give how long the container must leave the GPU alone first, e.g. 30s"
                );
            }
            Some(ms)
        }
        None => None,
    };
    Ok(Limit {
        memory_bytes,
        compute_pct,
        compute_cap_pct: None,
        park_after_ms,
        ..Limit::default()
    })
}

fn read_bounded(mut r: impl Read, max: u64, what: &str) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    r.by_ref()
        .take(max + 1)
        .read_to_end(&mut buf)
        .with_context(|| format!("reading {what}"))?;
    if buf.len() as u64 > max {
        bail!("{what} is larger than {}", Size(max));
    }
    Ok(buf)
}

/// Reads the state from `stdin` and the bundle's config.json: (state, limit).
pub fn read(stdin: impl Read, args: &HookArgs) -> Result<(State, Limit)> {
    let raw = read_bounded(stdin, MAX_STATE, "the OCI state on stdin")?;
    let state: State = serde_json::from_slice(&raw)
        .context("the OCI state on stdin is not valid (this command is run by the container runtime as a createRuntime hook)")?;
    let path = state.bundle.join("config.json");
    let file = std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let config: Config = serde_json::from_slice(&read_bounded(
        file,
        MAX_CONFIG,
        &path.display().to_string(),
    )?)
    .with_context(|| format!("{} is not a valid OCI config", path.display()))?;
    let granted = config.granted();
    let env = config.process.map(|p| p.env).unwrap_or_default();
    let limit = limit_from_env(&env, args, granted)
        .with_context(|| format!("container {}: refused", short(&state.id)))?;
    Ok((state, limit))
}

fn short(id: &str) -> &str {
    let end = id.char_indices().nth(12).map_or(id.len(), |(i, _)| i);
    &id[..end]
}

pub fn run(args: &HookArgs) -> Result<()> {
    let (state, limit) = read(std::io::stdin().lock(), args)?;
    if limit == Limit::default() {
        return Ok(()); // asks for nothing, and no default: nothing to hold
    }
    let Some(pid) = state.pid.filter(|p| *p > 0) else {
        bail!(
            "container {}: the OCI state has no pid (run this hook as createRuntime, when the \
             container's process exists)",
            short(&state.id)
        );
    };
    // The admin socket only: never fall back to the containers' socket (which refuses limits).
    let socket = args
        .admin_socket
        .clone()
        .or_else(|| std::env::var_os("FGPU_ADMIN_SOCKET").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(crate::DEFAULT_ADMIN_SOCKET));
    let req = LimitSetRequest {
        target: format!("pid:{pid}"),
        limit: limit.clone(),
        until_cgroup_removed: true,
        ..LimitSetRequest::default()
    };
    let body = Bytes::from(serde_json::to_vec(&req)?);
    match crate::cli::client::request(&socket, Kind::LimitSet, body, Kind::LimitReply) {
        Ok(reply) => {
            let entry: LimitEntry =
                serde_json::from_slice(&reply).context("the agent's reply is not valid")?;
            eprintln!(
                "fgpu: container {}: limit held by the agent on {}: {}",
                short(&state.id),
                entry.cgroup,
                describe(&limit)
            );
            Ok(())
        }
        Err(err) if args.allow_without_agent && is_unreachable(&err, &socket) => {
            eprintln!(
                "fgpu: warning: container {}: the agent is not reachable ({err:#}); starting \
                 it anyway: its shim enforces the environment's limit on its own",
                short(&state.id)
            );
            Ok(())
        }
        Err(err) => Err(err.context(format!(
            "container {}: cannot register its GPU limit ({}) with the agent; the container \
             is refused",
            short(&state.id),
            describe(&limit)
        ))),
    }
}

fn is_unreachable(err: &anyhow::Error, socket: &Path) -> bool {
    err.to_string().contains("agent is not running") || !socket.exists()
}

fn describe(l: &Limit) -> String {
    let mut parts = Vec::new();
    if let Some(m) = l.memory_bytes {
        parts.push(format!("memory {}", Size(m)));
    }
    if let Some(c) = l.compute_pct {
        parts.push(format!("compute {c}%"));
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> HookArgs {
        HookArgs {
            admin_socket: None,
            default_memory: None,
            max_memory: Some(40 << 30),
            max_compute: Some(90),
            granted: Vec::new(),
            allow_without_agent: false,
        }
    }

    fn env(vars: &[&str]) -> Vec<String> {
        vars.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn limits_from_the_environment() {
        let l = limit_from_env(
            &env(&["PATH=/bin", "FGPU_MEMORY_LIMIT=1GiB"]),
            &args(),
            None,
        )
        .unwrap();
        assert_eq!(l.memory_bytes, Some(1 << 30));
        let l = limit_from_env(&env(&["GPU_MEM_LIMIT_GB=2.5"]), &args(), None).unwrap();
        assert_eq!(l.memory_bytes, Some(5 << 29));
        let both = env(&["FGPU_MEMORY_LIMIT=8GiB", "GPU_MEM_LIMIT_GB=4"]);
        assert_eq!(
            limit_from_env(&both, &args(), None).unwrap().memory_bytes,
            Some(4 << 30)
        );
        let l = limit_from_env(&env(&["FGPU_COMPUTE_SHARE=30%"]), &args(), None).unwrap();
        assert_eq!((l.memory_bytes, l.compute_pct), (None, Some(30)));
        let l = limit_from_env(&env(&["FGPU_PARK_AFTER=30s"]), &args(), None).unwrap();
        assert_eq!(l.park_after_ms, Some(30_000));
        assert_eq!(
            limit_from_env(&env(&["FGPU_MEMORY_LIMIT="]), &args(), None).unwrap(),
            Limit::default()
        );
        let mut a = args();
        a.default_memory = Some(8 << 30);
        assert_eq!(
            limit_from_env(&[], &a, None).unwrap().memory_bytes,
            Some(8 << 30)
        );
    }

    #[test]
    fn hostile_values_are_refused_with_a_reason() {
        for (var, needle) in [
            ("FGPU_MEMORY_LIMIT=lots", "FGPU_MEMORY_LIMIT=lots"),
            ("FGPU_MEMORY_LIMIT=0", "0 bytes"),
            ("FGPU_MEMORY_LIMIT=-1GiB", "FGPU_MEMORY_LIMIT=-1GiB"),
            (
                "FGPU_MEMORY_LIMIT=99999999999999999999999",
                "FGPU_MEMORY_LIMIT=",
            ),
            ("FGPU_MEMORY_LIMIT=0:1GiB,1:2GiB", "per-device"),
            ("FGPU_MEMORY_LIMIT=41GiB", "above this node's maximum"),
            ("GPU_MEM_LIMIT_GB=1e9", "not a number of GiB"),
            ("GPU_MEM_LIMIT_GB=100", "above this node's maximum"),
            ("FGPU_COMPUTE_SHARE=250%", "FGPU_COMPUTE_SHARE"),
            ("FGPU_COMPUTE_SHARE=0", "1-100%"),
            ("FGPU_PARK_AFTER=0", "leave the GPU alone"),
            ("FGPU_PARK_AFTER=soon", "FGPU_PARK_AFTER=soon"),
            ("FGPU_COMPUTE_SHARE=95", "--max-compute"),
        ] {
            let err = limit_from_env(&env(&[var]), &args(), None)
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{var}: {err}");
        }
    }

    #[test]
    fn a_variable_set_twice_is_refused_by_name() {
        // The plugin's value, and the container's own after it (runc keeps the last) or
        // before it (containerd puts an image's ENV first): never either.
        for vars in [
            [
                "FGPU_COMPUTE_SHARE=10",
                "PATH=/bin",
                "FGPU_COMPUTE_SHARE=99",
            ],
            ["FGPU_MEMORY_LIMIT=1GiB", "X=1", "FGPU_MEMORY_LIMIT=30GiB"],
            ["GPU_MEM_LIMIT_GB=1", "GPU_MEM_LIMIT_GB=2", "X=1"],
            ["FGPU_PARK_AFTER=1s", "FGPU_PARK_AFTER=1h", "X=1"],
        ] {
            let name = vars[0].split('=').next().unwrap();
            let err = limit_from_env(&env(&vars), &args(), None)
                .unwrap_err()
                .to_string();
            assert!(err.contains(&format!("{name} is set 2 times")), "{err}");
        }
        // A name that only starts like one of fgpu's is another variable.
        let l = limit_from_env(
            &env(&["FGPU_COMPUTE_SHARE=10", "FGPU_COMPUTE_SHARE_X=99"]),
            &args(),
            None,
        )
        .unwrap();
        assert_eq!(l.compute_pct, Some(10));
    }

    #[test]
    fn a_device_plugin_container_gets_only_what_was_granted() {
        let mut a = args();
        a.default_memory = Some(2 << 30);
        let compute = Some(Granted {
            memory: false,
            compute: true,
        });
        let memory = Some(Granted {
            memory: true,
            compute: false,
        });
        // Compute only: the operator's default memory and the plugin's compute.
        let l = limit_from_env(&env(&["FGPU_COMPUTE_SHARE=1"]), &a, compute).unwrap();
        assert_eq!((l.memory_bytes, l.compute_pct), (Some(2 << 30), Some(1)));
        // Memory only: no share of its own, and none it adds itself.
        let l = limit_from_env(&env(&["FGPU_MEMORY_LIMIT=4GiB"]), &a, memory).unwrap();
        assert_eq!((l.memory_bytes, l.compute_pct), (Some(4 << 30), None));
        for (vars, granted, needle) in [
            (
                vec!["FGPU_MEMORY_LIMIT=4GiB", "FGPU_COMPUTE_SHARE=99"],
                memory,
                "FGPU_COMPUTE_SHARE is set",
            ),
            (
                vec!["FGPU_COMPUTE_SHARE=1", "FGPU_MEMORY_LIMIT=40GiB"],
                compute,
                "FGPU_MEMORY_LIMIT is set",
            ),
            (
                vec!["FGPU_COMPUTE_SHARE=1", "GPU_MEM_LIMIT_GB=40"],
                compute,
                "GPU_MEM_LIMIT_GB is set",
            ),
            (vec![], memory, "FGPU_MEMORY_LIMIT is not"),
        ] {
            let err = limit_from_env(&env(&vars), &a, granted)
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{vars:?}: {err}");
        }
    }

    #[test]
    fn grants_are_read_from_every_hook_of_the_config() {
        let config: Config = serde_json::from_str(
            r#"{"process":{"env":[]},"hooks":{"createRuntime":[
                {"path":"/opt/fgpu/bin/fgpu","args":["fgpu","cdi","hook"]},
                {"path":"/opt/fgpu/bin/fgpu","args":["fgpu","cdi","hook","--granted","compute"]},
                {"path":"/opt/fgpu/bin/fgpu","args":["fgpu","cdi","hook","--granted=memory"]}]}}"#,
        )
        .unwrap();
        assert_eq!(
            config.granted(),
            Some(Granted {
                memory: true,
                compute: true
            })
        );
        let none: Config = serde_json::from_str(
            r#"{"hooks":{"createRuntime":[{"path":"/x","args":["fgpu","cdi","hook"]}]}}"#,
        )
        .unwrap();
        assert_eq!(none.granted(), None);
        assert_eq!(Config::default().granted(), None);
    }

    #[test]
    fn state_and_config_are_read_bounded() {
        let dir = std::env::temp_dir().join(format!("fgpu-hook-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("config.json"),
            br#"{"ociVersion":"1.0.2","process":{"env":["FGPU_MEMORY_LIMIT=2GiB"]}}"#,
        )
        .unwrap();
        let state = format!(
            r#"{{"ociVersion":"1.0.2","id":"abcdef0123456789","status":"creating","pid":42,"bundle":"{}"}}"#,
            dir.display()
        );
        let (s, l) = read(state.as_bytes(), &args()).unwrap();
        assert_eq!((s.pid, l.memory_bytes), (Some(42), Some(2 << 30)));
        let err = read(&b"not json"[..], &args()).unwrap_err().to_string();
        assert!(err.contains("OCI state"), "{err}");
        let huge = vec![b' '; (MAX_STATE + 10) as usize];
        let err = format!("{:#}", read(&huge[..], &args()).unwrap_err());
        assert!(err.contains("larger than"), "{err}");
        std::fs::write(dir.join("config.json"), b"[1,2").unwrap();
        let err = format!("{:#}", read(state.as_bytes(), &args()).unwrap_err());
        assert!(err.contains("not a valid OCI config"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
