//! `fgpu limit set|get|ls|rm`: per-cgroup limits, kept by the agent.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use bytes::Bytes;
use clap::{Args, Subcommand};
use fgpu_common::inert::escape;
use fgpu_common::proto::Kind;
use fgpu_common::quantity::{Size, parse_percent, parse_size};

use crate::api::{Limit, LimitEntry, LimitSetRequest, TargetRequest};

const TARGET_HELP: &str = "A cgroup v2 path (/sys/fs/cgroup/..., /kubepods.slice/..., or \
                           relative to the cgroup root), pid:PID (that process's cgroup) or container:ID (a docker, podman, \
                           containerd or CRI-O container's cgroup, by id or unique prefix), pod:NAMESPACE/NAME or pod:UID (a Kubernetes \
                           pod's cgroup: all its containers under one limit)";

#[derive(Debug, Args)]
pub struct LimitArgs {
    #[command(subcommand)]
    command: LimitCommand,

    /// The agent socket to ask [default: $FGPU_ADMIN_SOCKET, else the admin socket
    /// /run/fgpu-admin/fgpu.sock, else (inside a container, where only the containers' socket
    /// is mounted) $FGPU_SOCKET or /run/fgpu/fgpu.sock].
    #[arg(long, value_name = "PATH", global = true)]
    socket: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum LimitCommand {
    /// Set a cgroup's limits (given fields only; others keep their value). The limit covers
    /// all processes of the cgroup and its descendants together and applies at once to
    /// processes already running.
    ///
    /// A memory limit applies on each GPU separately: without --gpu, the same limit on every
    /// GPU the cgroup uses; with --gpu, on the named GPUs only (it replaces the cgroup's
    /// plain limit there; other GPUs keep theirs). On each GPU the lowest limit of the cgroup
    /// and its ancestors applies.
    ///
    /// Examples:
    ///   fgpu limit set container:3f2a --memory 8GiB            (8 GiB on every GPU)
    ///   fgpu limit set container:3f2a --memory 1GiB --gpu 1    (1 GiB on GPU 1 only)
    ///   fgpu limit set pod:ml/train --memory 40GiB --gpu 0 --gpu GPU-5e1a
    ///   fgpu limit set container:3f2a --compute 30 --gpu 1     (a 30% share on GPU 1 only)
    #[command(verbatim_doc_comment)]
    Set {
        #[arg(help = TARGET_HELP)]
        target: String,
        /// GPU memory, e.g. 8GiB, 512MiB, 8GB (decimal) or bytes: on each GPU (or on the
        /// GPUs of --gpu only).
        #[arg(long, value_name = "SIZE", value_parser = size)]
        memory: Option<u64>,
        /// Set the values given (--memory, --compute, --compute-cap) on this GPU only
        /// (repeat for several): its NVML index as `nvidia-smi` shows it (0, 1, ...; not a
        /// container's CUDA_VISIBLE_DEVICES order), its UUID (GPU-5e1a...) or a prefix of
        /// the UUID that only this GPU has. MIG instances are not supported. An unknown or
        /// ambiguous GPU is an error that lists the node's GPUs, and nothing changes.
        /// Remove with `fgpu limit rm TARGET --gpu X`.
        #[arg(long = "gpu", value_name = "INDEX|UUID")]
        gpus: Vec<String>,
        /// Guaranteed share of the GPU's compute time, e.g. 30%.
        #[arg(long, value_name = "PCT", value_parser = pct)]
        compute: Option<u8>,
        /// Hard ceiling on compute time, never exceeded even on an idle GPU, e.g. 50%.
        #[arg(long, value_name = "PCT", value_parser = pct)]
        compute_cap: Option<u8>,
        /// Priority class on every GPU: `high` is served first within its share (its
        /// waiting ends a normal tenant's turn within ~2 ms) and what it leaves unused goes
        /// to the others at once; `low` only gets time no normal or high tenant wants. Takes
        /// effect with a --compute share or --compute-cap (here or inherited).
        #[arg(long, value_name = "CLASS", value_parser = priority_arg())]
        compute_priority: Option<crate::api::ComputePriority>,
        /// Make the cgroup parkable: once its processes have left the GPU alone this long
        /// (no launch, copy or allocation), and another container needs the device memory,
        /// the agent may move their device memory to host memory; their next launch brings
        /// it back at the same addresses. Applies to memory allocated after it is set
        /// (docs/parking.md). E.g. 30s, 2m, 500ms.
        #[arg(long, value_name = "DURATION", value_parser = duration)]
        park_after: Option<u64>,
    },
    /// Show the limits that apply to a cgroup (its own, or inherited from an ancestor).
    Get {
        #[arg(help = TARGET_HELP)]
        target: String,
        #[arg(long)]
        json: bool,
    },
    /// List every cgroup with limits of its own.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Remove a cgroup's own limits (it then inherits its ancestors', if any); with --gpu,
    /// only its per-GPU values on those GPUs (they fall back to its plain ones, if any).
    #[command(visible_alias = "clear")]
    Rm {
        #[arg(help = TARGET_HELP)]
        target: String,
        /// Remove only the per-GPU values (memory, compute) on this GPU (an index, UUID or
        /// unique UUID prefix, as for `limit set --gpu`); repeat for several.
        #[arg(long = "gpu", value_name = "INDEX|UUID")]
        gpus: Vec<String>,
    },
}

fn size(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// `30s`, `2m`, `500ms`: the shortest exact way to write `ms`.
fn show_ms(ms: u64) -> String {
    match ms {
        0 => "0s".into(),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    }
}

fn duration(s: &str) -> Result<u64, String> {
    fgpu_common::quantity::parse_duration_ms(s).map_err(|e| e.to_string())
}

fn pct(s: &str) -> Result<u8, String> {
    parse_percent(s).map_err(|e| e.to_string())
}

/// `--compute-priority`: one of the classes, listed in `--help` and in the error for any
/// other word (the wire type stays free of clap: the fuzz crate builds it alone).
fn priority_arg() -> impl clap::builder::TypedValueParser<Value = crate::api::ComputePriority> {
    use clap::builder::{PossibleValuesParser, TypedValueParser};
    let names = crate::api::ComputePriority::ALL.map(|p| p.as_str());
    PossibleValuesParser::new(names).map(|s| {
        crate::api::ComputePriority::parse(&s)
            .expect("PossibleValuesParser admits only class names")
    })
}

pub fn run(args: &LimitArgs) -> Result<()> {
    let socket = crate::socket_path(args.socket.clone());
    let ask = |kind: Kind, body: Vec<u8>| {
        super::client::request(&socket, kind, Bytes::from(body), Kind::LimitReply)
    };
    match &args.command {
        LimitCommand::Set {
            target,
            memory,
            gpus,
            compute,
            compute_cap,
            compute_priority,
            park_after,
        } => {
            if memory.is_none()
                && compute.is_none()
                && compute_cap.is_none()
                && compute_priority.is_none()
                && park_after.is_none()
            {
                anyhow::bail!(
                    "nothing to set: give --memory, --compute, --compute-cap, --compute-priority or --park-after"
                );
            }
            if (compute_priority.is_some() || park_after.is_some()) && !gpus.is_empty() {
                anyhow::bail!(
                    "--compute-priority and --park-after apply on every GPU: set them without --gpu (nothing was changed)"
                );
            }
            // With --gpu every value given goes per GPU, as written; the agent resolves the
            // GPUs. The plain fields stay unset then (an agent without per-GPU limits
            // refuses the request instead of applying the values to every GPU).
            let req = if gpus.is_empty() {
                LimitSetRequest {
                    target: crate::k8s::target::resolve(target)?,
                    limit: Limit {
                        memory_bytes: *memory,
                        compute_pct: *compute,
                        compute_cap_pct: *compute_cap,
                        compute_priority: *compute_priority,
                        park_after_ms: *park_after,
                        ..Limit::default()
                    },
                    ..LimitSetRequest::default()
                }
            } else {
                let each = |v: Option<u8>| -> std::collections::BTreeMap<String, u8> {
                    v.map(|p| gpus.iter().map(|g| (g.clone(), p)).collect())
                        .unwrap_or_default()
                };
                LimitSetRequest {
                    target: crate::k8s::target::resolve(target)?,
                    memory_gpus: memory
                        .map(|m| gpus.iter().map(|g| (g.clone(), m)).collect())
                        .unwrap_or_default(),
                    compute_gpus: each(*compute),
                    compute_cap_gpus: each(*compute_cap),
                    ..LimitSetRequest::default()
                }
            };
            let entry: LimitEntry = parse(&ask(Kind::LimitSet, serde_json::to_vec(&req)?)?)?;
            print!("{}", table(&[entry]));
        }
        LimitCommand::Get { target, json } => {
            let req = TargetRequest {
                target: crate::k8s::target::resolve(target)?,
            };
            let entry: LimitEntry = parse(&ask(Kind::LimitGet, serde_json::to_vec(&req)?)?)?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&entry)?);
            } else {
                print!("{}", table(&[entry]));
            }
        }
        LimitCommand::Ls { json } => {
            let entries: Vec<LimitEntry> = parse(&ask(Kind::LimitList, Vec::new())?)?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&entries)?);
            } else if entries.is_empty() {
                println!("(no limits set)");
            } else {
                print!("{}", table(&entries));
            }
        }
        LimitCommand::Rm { target, gpus } if !gpus.is_empty() => {
            // Sent as a change (an agent without per-GPU limits refuses it as empty rather
            // than removing the whole limit).
            let req = LimitSetRequest {
                target: crate::k8s::target::resolve(target)?,
                clear_gpus: gpus.clone(),
                ..LimitSetRequest::default()
            };
            let entry: LimitEntry = parse(&ask(Kind::LimitSet, serde_json::to_vec(&req)?)?)?;
            println!(
                "removed the per-GPU limits of {} on {}",
                escape(&entry.cgroup),
                gpus.join(", ")
            );
            print!("{}", table(&[entry]));
        }
        LimitCommand::Rm { target, .. } => {
            let req = TargetRequest {
                target: crate::k8s::target::resolve(target)?,
            };
            let entry: LimitEntry = parse(&ask(Kind::LimitRemove, serde_json::to_vec(&req)?)?)?;
            println!("removed the limits of {}", escape(&entry.cgroup));
            if entry.effective != Limit::default() {
                print!("{}", table(&[entry]));
            }
        }
    }
    Ok(())
}

fn parse<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T> {
    serde_json::from_slice(payload).context("the agent's reply is not valid")
}

/// Columns: cgroup, memory, compute, cap; inherited values are marked with where they come from.
pub fn table(entries: &[LimitEntry]) -> String {
    // Paths may carry names a tenant chose: shown escaped, the column measured after.
    let names: Vec<_> = entries.iter().map(|e| escape(&e.cgroup)).collect();
    let width = names
        .iter()
        .map(|n| n.chars().count())
        .chain([6])
        .max()
        .unwrap_or(6);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<width$}  {:>10}  {:>8}  {:>8}  NOTE",
        "CGROUP", "MEMORY", "COMPUTE", "CAP"
    );
    for (e, name) in entries.iter().zip(&names) {
        let memory = e
            .effective
            .memory_bytes
            .map_or("-".into(), |b| Size(b).to_string());
        let compute = e
            .effective
            .compute_pct
            .map_or("-".into(), |p| format!("{p}%"));
        let cap = e
            .effective
            .compute_cap_pct
            .map_or("-".into(), |p| format!("{p}%"));
        let mut note = match &e.memory_limit_from {
            Some(from) if *from != e.cgroup => format!("memory inherited from {}", escape(from)),
            _ => String::new(),
        };
        if let Some(p) = e.effective.compute_priority {
            let sep = if note.is_empty() { "" } else { "; " };
            let _ = write!(note, "{sep}priority {}", p.as_str());
        }
        if let Some(ms) = e.effective.park_after_ms {
            let sep = if note.is_empty() { "" } else { "; " };
            let _ = write!(note, "{sep}parkable after {}", show_ms(ms));
        }
        let _ = writeln!(
            out,
            "{:<width$}  {memory:>10}  {compute:>8}  {cap:>8}  {note}",
            name
        );
        // Per-GPU compute settings, one line each under the cgroup's row.
        let gpus: std::collections::BTreeSet<&String> = e
            .effective
            .compute_gpus
            .keys()
            .chain(e.effective.compute_cap_gpus.keys())
            .collect();
        for uuid in gpus {
            let show = |p: Option<u8>| p.map_or("-".into(), |p| format!("{p}%"));
            let _ = writeln!(
                out,
                "{:<width$}  {:>10}  {:>8}  {:>8}  on {uuid}",
                "",
                "",
                show(e.effective.compute_on(uuid)),
                show(e.effective.compute_cap_on(uuid)),
            );
        }
        // Per-GPU memory limits, one line each under the cgroup's row.
        for (uuid, bytes) in &e.effective.memory_gpus {
            let own = if e.own.memory_on(uuid) == Some(*bytes) {
                ""
            } else {
                " (from an ancestor)"
            };
            let _ = writeln!(
                out,
                "{:<width$}  {:>10}  {:>8}  {:>8}  on {uuid}{own}",
                "",
                Size(*bytes).to_string(),
                "",
                ""
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_a_tenant_named_reach_the_terminal_escaped() {
        let e = LimitEntry {
            cgroup: "/t/a\x1b[2J\r\u{202e}b".into(),
            own: Limit::default(),
            effective: Limit {
                memory_bytes: Some(1 << 30),
                ..Limit::default()
            },
            memory_limit_from: Some("/t\x1b]52;c;YQ==\x07".into()),
        };
        let t = table(&[e]);
        assert!(
            t.chars().all(|c| c == '\n' || (' '..='~').contains(&c)),
            "raw control or format characters in {t:?}"
        );
        assert!(t.contains("/t/a\\x1b[2J\\x0d\\u{202e}b"), "{t}");
        assert!(t.contains("inherited from /t\\x1b]52;c;YQ==\\x07"), "{t}");
        // The columns line up after the escapes.
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0].find("MEMORY").map(|i| i + 6),
            lines[1].find("1GiB").map(|i| i + 4),
            "{t}"
        );
    }

    #[test]
    fn table_marks_inherited_limits() {
        let e = LimitEntry {
            cgroup: "/team/job".into(),
            own: Limit::default(),
            effective: Limit {
                memory_bytes: Some(1 << 30),
                compute_pct: Some(30),
                compute_cap_pct: None,
                ..Limit::default()
            },
            memory_limit_from: Some("/team".into()),
        };
        let t = table(&[e]);
        assert!(t.contains("1GiB"), "{t}");
        assert!(t.contains("30%"), "{t}");
        assert!(t.contains("memory inherited from /team"), "{t}");
    }
}
