//! Handling control requests: limits and status, each answered with one frame.

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use fgpu_common::proto::{Frame, Kind};
use fgpu_common::quantity::Size;

use super::report::State;
use super::targets;
use crate::api::{Limit, LimitEntry, LimitSetRequest, TargetRequest};

/// Who is asking, from the socket's SO_PEERCRED.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    pub pid: Option<u32>,
    pub uid: u32,
    pub gid: u32,
}

/// Answers one request. Errors become `Kind::Error` frames with the message for people.
pub fn answer(state: &State, peer: Peer, frame: &Frame) -> Frame {
    let result = match frame.kind {
        Kind::StatusRequest
        | Kind::LimitSet
        | Kind::LimitGet
        | Kind::LimitList
        | Kind::LimitRemove
            if !state.access.allows(peer) =>
        {
            Err(anyhow::anyhow!(
                "permission denied: the fgpu control socket answers root{} only",
                state
                    .access
                    .group_name
                    .as_ref()
                    .map(|g| format!(" and members of group {g}"))
                    .unwrap_or_default()
            ))
        }
        Kind::StatusRequest => serde_json::to_vec(&state.report())
            .map(|v| Frame::new(Kind::StatusReply, v))
            .map_err(Into::into),
        Kind::LimitSet => limit_set(state, &frame.payload),
        Kind::LimitGet => limit_get(state, &frame.payload),
        Kind::LimitList => limit_list(state),
        Kind::LimitRemove => limit_remove(state, &frame.payload),
        other => Err(anyhow::anyhow!("unexpected request {other:?}")),
    };
    result.unwrap_or_else(|err| Frame::new(Kind::Error, format!("{err:#}")))
}

fn reply(value: &impl serde::Serialize) -> Result<Frame> {
    Ok(Frame::new(
        Kind::LimitReply,
        Bytes::from(serde_json::to_vec(value)?),
    ))
}

fn entry(state: &State, cgroup: &str) -> LimitEntry {
    let store = state.limits.lock().expect("limits lock");
    let (effective, memory_limit_from) = store.effective(cgroup);
    LimitEntry {
        cgroup: cgroup.to_string(),
        own: store.own(cgroup).cloned().unwrap_or_default(),
        effective,
        memory_limit_from,
    }
}

fn limit_set(state: &State, payload: &[u8]) -> Result<Frame> {
    let req: LimitSetRequest =
        serde_json::from_slice(payload).context("malformed limit request")?;
    validate(state, &req.limit)?;
    let cgroup = targets::resolve(&req.target, &state.cgroup2_mount)?;
    state
        .limits
        .lock()
        .expect("limits lock")
        .set(&cgroup, &req.limit)?;
    state.backstop.limits_changed();
    state.apply_limits();
    tracing::info!(cgroup, limit = ?req.limit, "limit set");
    reply(&entry(state, &cgroup))
}

fn limit_get(state: &State, payload: &[u8]) -> Result<Frame> {
    let req: TargetRequest = serde_json::from_slice(payload).context("malformed limit request")?;
    let cgroup = targets::resolve(&req.target, &state.cgroup2_mount)?;
    reply(&entry(state, &cgroup))
}

fn limit_list(state: &State) -> Result<Frame> {
    let paths: Vec<String> = state
        .limits
        .lock()
        .expect("limits lock")
        .all()
        .map(|(p, _)| p.clone())
        .collect();
    let entries: Vec<LimitEntry> = paths.iter().map(|p| entry(state, p)).collect();
    reply(&entries)
}

fn limit_remove(state: &State, payload: &[u8]) -> Result<Frame> {
    let req: TargetRequest = serde_json::from_slice(payload).context("malformed limit request")?;
    // A cgroup removed since its limit was set can still have its limit removed.
    let cgroup = match targets::resolve(&req.target, &state.cgroup2_mount) {
        Ok(c) => c,
        Err(err) => {
            let literal = format!("/{}", req.target.trim().trim_matches('/'));
            if state
                .limits
                .lock()
                .expect("limits lock")
                .own(&literal)
                .is_none()
            {
                return Err(err);
            }
            literal
        }
    };
    let removed = state.limits.lock().expect("limits lock").remove(&cgroup)?;
    state.backstop.limits_changed();
    state.apply_limits();
    if removed.is_none() {
        bail!("{cgroup} has no limit of its own (see `fgpu limit get {cgroup}`)");
    }
    tracing::info!(cgroup, "limit removed");
    reply(&entry(state, &cgroup))
}

fn validate(state: &State, limit: &Limit) -> Result<()> {
    if *limit == Limit::default() {
        bail!("nothing to set: give --memory, --compute or --compute-cap");
    }
    if let Some(bytes) = limit.memory_bytes {
        if bytes == 0 {
            bail!(
                "a memory limit of 0 would refuse every allocation; to lift a limit use `fgpu limit rm`"
            );
        }
        if let Some(device) = state.gpus.largest_memory()
            && bytes > device
        {
            bail!(
                "memory limit {} is larger than the device ({} on the largest GPU of this node)",
                Size(bytes),
                Size(device)
            );
        }
    }
    for (name, pct) in [
        ("--compute", limit.compute_pct),
        ("--compute-cap", limit.compute_cap_pct),
    ] {
        if let Some(p) = pct
            && !(1..=100).contains(&p)
        {
            bail!("{name} {p}% is out of range: give 1-100%");
        }
    }
    Ok(())
}

/// Who may use the control requests: root, and the members of one configured group.
#[derive(Debug, Clone, Default)]
pub struct Access {
    pub group_name: Option<String>,
    pub group_gid: Option<u32>,
}

impl Access {
    pub fn allows(&self, peer: Peer) -> bool {
        if peer.uid == 0 {
            return true;
        }
        let Some(gid) = self.group_gid else {
            return false;
        };
        peer.gid == gid
            || peer
                .pid
                .is_some_and(|pid| supplementary_groups(pid).contains(&gid))
    }
}

fn supplementary_groups(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("Groups:")).map(|g| {
                g.split_whitespace()
                    .filter_map(|n| n.parse().ok())
                    .collect()
            })
        })
        .unwrap_or_default()
}
