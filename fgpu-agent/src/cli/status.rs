//! `fgpu status`: GPU memory use and compute time per cgroup.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use bytes::Bytes;
use clap::Args;
use fgpu_common::inert::escape;
use fgpu_common::proto::Kind;
use fgpu_common::quantity::Size;

use crate::status::StatusReport;

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print a JSON array, one object per cgroup (fields: cgroup, cgroup_id, pids,
    /// memory_used_bytes, memory_limit_bytes, memory_limit_gpus (per-GPU limits by UUID),
    /// alloc_denied (as the tenant's shims report it), over_limit_actions, devices (per GPU:
    /// device, uuid, memory_used_bytes, limit_bytes, allocs, frees),
    /// compute_share_pct, compute_cap_pct (and compute_share_gpus, compute_cap_gpus: per-GPU
    /// values by UUID), compute_turn_pct (device time held in turns: what a
    /// share is a share of), compute_corun, compute_queue_us (the queue bound of each of
    /// its processes), compute_used_pct (measured GPU time),
    /// compute_nvml_pct, container_id: the container whose cgroup it is; pod: its Kubernetes
    /// pod, `namespace/name` where an fgpu DRA claim names it; pod_uid, pod_namespace,
    /// pod_name: the same as fields).
    #[arg(long)]
    json: bool,

    /// With --json: print one object with the cgroups, the kernel side's counters (events
    /// dropped, untracked allocations, frees of unknown pointers, failed calls) and the
    /// probed libraries.
    #[arg(long, requires = "json")]
    detail: bool,

    /// The agent socket to ask; on the containers' socket the status is the caller's own
    /// cgroup's row only [default: $FGPU_ADMIN_SOCKET, else the admin socket
    /// /run/fgpu-admin/fgpu.sock, else (inside a container, where only the containers' socket
    /// is mounted) $FGPU_SOCKET or /run/fgpu/fgpu.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
}

pub fn run(args: &StatusArgs) -> Result<()> {
    let socket = crate::socket_path(args.socket.clone());
    let payload = super::client::request(
        &socket,
        Kind::StatusRequest,
        Bytes::new(),
        Kind::StatusReply,
    )?;
    let report: StatusReport =
        serde_json::from_slice(&payload).context("the agent's status reply is not valid")?;
    if args.json && args.detail {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if args.json {
        println!("{}", serde_json::to_string_pretty(&report.cgroups)?);
    } else {
        print!("{}", table(&report));
    }
    Ok(())
}

/// Says what the DENIED column is, below the table.
const DENIED_LEGEND: &str = "DENIED*: allocations refused at the limit, as reported by the \
                             tenant's own shims (written in its usage page; not checked by \
                             the agent)";

/// The human-readable form: one row per cgroup, then what the kernel side counted. Every
/// name in it (cgroup paths, pods, GPU UUIDs, library paths) may have been chosen by a
/// tenant and is printed escaped ([`fgpu_common::inert`]): no control character of it
/// reaches the terminal.
pub fn table(report: &StatusReport) -> String {
    let mut out = String::new();
    let width = report
        .cgroups
        .iter()
        .map(|c| escape(&c.cgroup).chars().count())
        .chain([6])
        .max()
        .unwrap_or(6);
    // CONTAINER: `namespace/pod/` (Kubernetes) before the container's short id.
    let who = |c: &crate::status::CgroupStatus| -> String {
        let id = c.container_id.as_deref().map(|id| &id[..id.len().min(12)]);
        let who = match (c.pod.as_deref(), id) {
            (Some(p), Some(id)) => format!("{p}/{id}"),
            (Some(p), None) => p.to_string(),
            (None, Some(id)) => id.to_string(),
            (None, None) => "-".to_string(),
        };
        escape(&who).into_owned()
    };
    let cwidth = report
        .cgroups
        .iter()
        .map(|c| who(c).chars().count())
        .chain([12])
        .max()
        .unwrap_or(12);
    let _ = writeln!(
        out,
        "{:<width$}  {:<cwidth$}  {:<16}  {:>10}  {:>10}  {:>7}  {:>12}  {:>8}  {:>8}  LIMIT-FROM",
        "CGROUP", "CONTAINER", "PIDS", "USED", "LIMIT", "DENIED*", "COMPUTE", "TURNS", "GPU-TIME"
    );
    for c in &report.cgroups {
        let pids = if c.pids.is_empty() {
            "-".to_string()
        } else {
            c.pids
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        // With per-GPU limits the row says so and one line per GPU follows.
        let limit = if c.memory_limit_gpus.is_empty() {
            c.memory_limit_bytes
                .map_or_else(|| "-".to_string(), |l| Size(l).to_string())
        } else {
            "per GPU".to_string()
        };
        let per_gpu_compute = !c.compute_share_gpus.is_empty() || !c.compute_cap_gpus.is_empty();
        let compute = match (c.compute_share_pct, c.compute_cap_pct) {
            _ if per_gpu_compute => "per GPU".to_string(),
            (None, None) => "-".to_string(),
            (Some(s), None) => format!("{s}%"),
            (None, Some(k)) => format!("cap {k}%"),
            (Some(s), Some(k)) => format!("{s}% cap {k}%"),
        };
        let used = c
            .compute_used_pct
            .map_or_else(|| "-".to_string(), |u| format!("{u:.1}%"));
        // The device time held in turns (what a share is a share of); `co-run` for a
        // latency-bound tenant running beside the holder.
        let turns = if c.compute_corun {
            "co-run".to_string()
        } else {
            c.compute_turn_pct
                .map_or_else(|| "-".to_string(), |t| format!("{t:.1}%"))
        };
        let from = match &c.memory_limit_from {
            Some(f) if *f != c.cgroup => escape(f),
            _ => "".into(),
        };
        let _ = writeln!(
            out,
            "{:<width$}  {:<cwidth$}  {:<16}  {:>10}  {:>10}  {:>7}  {:>12}  {:>8}  {:>8}  {from}",
            escape(&c.cgroup),
            who(c),
            pids,
            Size(c.memory_used_bytes).to_string(),
            limit,
            c.alloc_denied,
            compute,
            turns,
            used
        );
        if c.parked_bytes > 0 {
            let _ = writeln!(
                out,
                "{:<width$}  parked: {} in host memory",
                "",
                Size(c.parked_bytes)
            );
        }
        if c.park_after_ms.is_some() && !c.park_pinned.is_empty() {
            let _ = writeln!(
                out,
                "{:<width$}  not parkable: {}",
                "",
                escape(&c.park_pinned.join(", "))
            );
        }
        if !c.memory_limit_gpus.is_empty() {
            for d in &c.devices {
                let _ = writeln!(
                    out,
                    "{:<width$}  {:<cwidth$}  {:<16}  {:>10}  {:>10}",
                    format!("  GPU {}", d.device),
                    "",
                    escape(d.uuid.as_deref().unwrap_or("-")),
                    Size(d.memory_used_bytes).to_string(),
                    d.limit_bytes
                        .map_or_else(|| "-".to_string(), |l| Size(l).to_string()),
                );
            }
        }
        if per_gpu_compute {
            let uuids: std::collections::BTreeSet<&String> = c
                .compute_share_gpus
                .keys()
                .chain(c.compute_cap_gpus.keys())
                .collect();
            for uuid in uuids {
                let share = c
                    .compute_share_gpus
                    .get(uuid)
                    .copied()
                    .or(c.compute_share_pct);
                let cap = c.compute_cap_gpus.get(uuid).copied().or(c.compute_cap_pct);
                let setting = match (share, cap) {
                    (None, None) => "-".to_string(),
                    (Some(s), None) => format!("{s}%"),
                    (None, Some(k)) => format!("cap {k}%"),
                    (Some(s), Some(k)) => format!("{s}% cap {k}%"),
                };
                let _ = writeln!(
                    out,
                    "{:<width$}  compute on {}: {setting}",
                    "",
                    escape(uuid)
                );
            }
        }
    }
    if report.cgroups.is_empty() {
        let _ = writeln!(out, "(no cgroup holds GPU memory)");
    } else {
        let _ = writeln!(out, "{DENIED_LEGEND}");
    }
    if report.own_only {
        let _ = writeln!(
            out,
            "\n(the containers' socket shows this cgroup's row only; the node's full status \
             is on the host: `sudo fgpu status`)"
        );
        return out;
    }
    let k = &report.counters;
    let _ = writeln!(
        out,
        "\nprobed: {}\nkernel: {} events dropped, {} untracked (map full), {} frees of unknown pointers, {} failed calls\nbackstop: {} allocations over a limit, {} processes killed, {} allocations past a tenant's tracking bound",
        if report.libraries.is_empty() {
            "-".to_string()
        } else {
            escape(&report.libraries.join(", ")).into_owned()
        },
        k.ringbuf_drops,
        k.map_full,
        k.unknown_frees,
        k.failed_calls,
        k.over_limit,
        k.killed,
        k.over_bound
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{CgroupStatus, KernelCounters};

    #[test]
    fn table_shows_sizes_people_read() {
        let report = StatusReport {
            cgroups: vec![CgroupStatus {
                cgroup_id: 9,
                pids: vec![10, 11],
                memory_used_bytes: 805_306_368,
                memory_limit_bytes: Some(1 << 30),
                alloc_denied: 2,
                compute_share_pct: Some(30),
                compute_used_pct: Some(29.6),
                compute_turn_pct: Some(30.2),
                ..CgroupStatus::empty("/fgpu/job-1".into())
            }],
            counters: KernelCounters {
                ringbuf_drops: 3,
                ..Default::default()
            },
            libraries: vec!["/usr/lib/libcuda.so.1".into()],
            own_only: false,
        };
        let t = table(&report);
        assert!(t.contains("/fgpu/job-1"), "{t}");
        assert!(t.contains("768MiB"), "{t}");
        assert!(t.contains("1GiB"), "{t}");
        assert!(t.contains("10,11"), "{t}");
        assert!(t.contains("3 events dropped"), "{t}");
        assert!(t.contains("30%") && t.contains("29.6%"), "{t}");
        assert!(t.contains("TURNS") && t.contains("30.2%"), "{t}");

        let mut per_gpu = report.clone();
        let uuid = "GPU-5e1a0000-0000-0000-0000-000000000001";
        per_gpu.cgroups[0].memory_limit_gpus = [(uuid.to_string(), 1 << 30)].into();
        per_gpu.cgroups[0].devices = vec![
            crate::status::DeviceUsage {
                device: 0,
                uuid: Some("GPU-5e1a0000-0000-0000-0000-000000000000".into()),
                memory_used_bytes: 0,
                limit_bytes: None,
                allocs: 0,
                frees: 0,
            },
            crate::status::DeviceUsage {
                device: 1,
                uuid: Some(uuid.into()),
                memory_used_bytes: 805_306_368,
                limit_bytes: Some(1 << 30),
                allocs: 1,
                frees: 0,
            },
        ];
        let t = table(&per_gpu);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[1].contains("per GPU"), "{t}");
        assert!(
            lines[2].starts_with("  GPU 0") && lines[2].trim_end().ends_with('-'),
            "{t}"
        );
        assert!(
            lines[3].starts_with("  GPU 1")
                && lines[3].contains(uuid)
                && lines[3].contains("768MiB")
                && lines[3].trim_end().ends_with("1GiB"),
            "{t}"
        );

        let own = StatusReport {
            own_only: true,
            ..report
        };
        let t = table(&own);
        assert!(t.contains("/fgpu/job-1"), "{t}");
        assert!(t.contains("this cgroup's row only"), "{t}");
        assert!(!t.contains("events dropped"), "{t}");
    }

    #[test]
    fn names_tenants_chose_reach_the_terminal_escaped() {
        // Clear the screen, set the clipboard (OSC 52), return to the line's start and write
        // over it, reverse what follows.
        let evil = "/t/x\x1b[2J\x1b]52;c;cm0gLXJmIH4K\x07\rroot-row\u{202e}gpj.exe";
        let mut row = CgroupStatus {
            alloc_denied: 7,
            pod: Some("ns/p\x1b[31m".into()),
            memory_limit_from: Some(format!("{evil}/..")),
            ..CgroupStatus::empty(evil.into())
        };
        row.memory_limit_bytes = Some(1 << 30);
        let report = StatusReport {
            cgroups: vec![row],
            libraries: vec!["/c/libcuda.so\x1b]0;t\x07".into()],
            ..StatusReport::default()
        };
        let t = table(&report);
        for line in t.lines() {
            assert!(
                line.chars().all(|c| (' '..='~').contains(&c)),
                "raw control or format characters in {line:?}"
            );
        }
        assert!(
            t.contains("/t/x\\x1b[2J\\x1b]52;c;cm0gLXJmIH4K\\x07\\x0droot-row\\u{202e}gpj.exe"),
            "{t}"
        );
        assert!(
            t.contains("ns/p\\x1b[31m") && t.contains("libcuda.so\\x1b]0;t\\x07"),
            "{t}"
        );
        // The columns line up after the escapes.
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0].find("CONTAINER"), lines[1].find("ns/p"), "{t}");
        assert!(
            lines[0].contains("DENIED*") && t.contains("as reported by the tenant"),
            "{t}"
        );
    }
}
