//! Handling control requests: limits and status, each answered with one frame.
//!
//! What a caller may ask depends on the door it came in by ([`Door`]): the containers'
//! socket answers only the caller's own status; the admin socket answers everything, the
//! control requests only to callers on the host (the agent's PID, mount and user namespaces)
//! who are root or in `--socket-group`. Every limit change is logged with who made it.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use fgpu_common::proto::{Frame, Kind};
use fgpu_common::quantity::Size;

use super::doors::Door;
use super::peer::Caller;
use super::request::{self, Request};
use super::state::State;
use super::targets;
use crate::api::{Limit, LimitEntry, LimitSetRequest, PodName, TargetRequest};
use crate::status::{CgroupStatus, StatusReport};

/// The refusal on the containers' socket, for anything but Hello and the caller's own status.
pub const CONTAINERS_REFUSAL: &str = "permission denied: the containers' socket answers Hello and \
     the caller's own status only; limits and other cgroups' status are served only on the host, \
     through the agent's admin socket";

/// Answers one request. Errors become `Kind::Error` frames with the message for people.
pub fn answer(state: &State, caller: &Caller, frame: &Frame) -> Frame {
    let result = request::decode(frame)
        .map_err(anyhow::Error::msg)
        .and_then(|req| match caller.door {
            Door::Containers => containers(state, caller, &req),
            Door::Admin => admin(state, caller, &req),
        });
    result.unwrap_or_else(|err| Frame::new(Kind::Error, format!("{err:#}")))
}

/// The containers' door: the caller's own row, nothing else.
fn containers(state: &State, caller: &Caller, req: &Request) -> Result<Frame> {
    match req {
        Request::Status => {
            let Some(cgroup) = &caller.cgroup else {
                bail!("cannot tell which cgroup the caller is in (no readable /proc entry)");
            };
            let report = own_status(state, cgroup);
            Ok(Frame::new(Kind::StatusReply, serde_json::to_vec(&report)?))
        }
        other => {
            refused(caller, other, "containers' socket");
            bail!(CONTAINERS_REFUSAL)
        }
    }
}

/// The admin door: everything, for host callers with the right credentials.
fn admin(state: &State, caller: &Caller, req: &Request) -> Result<Frame> {
    if let Err(why) = &caller.host {
        refused(caller, req, why);
        bail!(
            "permission denied: {why}; the admin socket serves only callers on the host \
             (the agent's PID, mount and user namespaces)"
        );
    }
    if !state.access().allows(caller.peer) {
        refused(caller, req, "not root nor in --socket-group");
        bail!(
            "permission denied: the fgpu admin socket answers root{} only",
            state
                .access()
                .group_name
                .as_ref()
                .map(|g| format!(" and members of group {g}"))
                .unwrap_or_default()
        );
    }
    match req {
        Request::Status => serde_json::to_vec(&super::report::of(state))
            .map(|v| Frame::new(Kind::StatusReply, v))
            .map_err(Into::into),
        Request::LimitSet(r) => limit_set(state, caller, r),
        Request::LimitGet(r) => limit_get(state, r),
        Request::LimitList => limit_list(state),
        Request::LimitRemove(r) => limit_remove(state, caller, r),
    }
}

/// Logs a refused request, state-changing ones at warn (someone tried to change a limit).
fn refused(caller: &Caller, req: &Request, why: &str) {
    if req.changes_state() {
        tracing::warn!(
            door = caller.door.name(),
            uid = caller.peer.uid,
            pid = caller.peer.pid,
            caller_cgroup = caller.cgroup_or_dash(),
            request = req.name(),
            "refused a limit change: {why}"
        );
    } else {
        tracing::debug!(
            door = caller.door.name(),
            uid = caller.peer.uid,
            pid = caller.peer.pid,
            caller_cgroup = caller.cgroup_or_dash(),
            request = req.name(),
            "refused: {why}"
        );
    }
}

/// The status of one cgroup only: its row (an empty one with its limits if it holds no GPU
/// memory), without the node-wide counters and libraries.
pub fn own_status(state: &State, cgroup: &str) -> StatusReport {
    let full = super::report::of(state);
    let row = full
        .cgroups
        .into_iter()
        .find(|r| r.cgroup == cgroup)
        .unwrap_or_else(|| {
            let mut row = CgroupStatus::empty(cgroup.to_string());
            let store = state.limits();
            let effective = store.effective(cgroup).0;
            row.memory_limit_bytes = effective.memory_bytes;
            row.memory_limit_gpus = effective.memory_gpus.clone();
            row.compute_share_pct = effective.compute_pct;
            row.compute_cap_pct = effective.compute_cap_pct;
            row.compute_share_gpus = effective.compute_gpus.clone();
            row.compute_cap_gpus = effective.compute_cap_gpus.clone();
            row
        });
    StatusReport {
        cgroups: vec![row],
        own_only: true,
        ..StatusReport::default()
    }
}

fn reply(value: &impl serde::Serialize) -> Result<Frame> {
    Ok(Frame::new(
        Kind::LimitReply,
        Bytes::from(serde_json::to_vec(value)?),
    ))
}

fn entry(state: &State, cgroup: &str) -> LimitEntry {
    let store = state.limits();
    let (effective, memory_limit_from) = store.effective(cgroup);
    LimitEntry {
        cgroup: cgroup.to_string(),
        own: store.own(cgroup).cloned().unwrap_or_default(),
        effective,
        memory_limit_from,
    }
}

/// Per-GPU values keyed as the user wrote the GPUs (`--gpu`) → keyed by UUID; an error names
/// the first GPU that does not resolve.
fn by_uuid<T: Copy>(
    state: &State,
    a: &BTreeMap<String, T>,
    b: &BTreeMap<String, T>,
) -> Result<BTreeMap<String, T>> {
    a.iter()
        .chain(b)
        .map(|(gpu, v)| Ok((super::gpusel::resolve(state.devices(), gpu)?, *v)))
        .collect()
}

fn limit_set(state: &State, caller: &Caller, req: &LimitSetRequest) -> Result<Frame> {
    // Every GPU the request names is resolved, and every value checked, before anything
    // changes: a bad `--gpu` leaves the limits as they were.
    let mut limit = req.limit.clone();
    limit.memory_gpus = by_uuid(state, &limit.memory_gpus, &req.memory_gpus)?;
    limit.compute_gpus = by_uuid(state, &limit.compute_gpus, &req.compute_gpus)?;
    limit.compute_cap_gpus = by_uuid(state, &limit.compute_cap_gpus, &req.compute_cap_gpus)?;
    let clear = super::gpusel::resolve_all(state.devices(), &req.clear_gpus)?;
    if let Some(uuid) = clear.iter().find(|u| limit.names_gpu(u)) {
        bail!(
            "{} is both set and removed in one request",
            super::gpusel::describe(state.devices(), uuid)
        );
    }
    if clear.is_empty() || limit != Limit::default() {
        validate(state, &limit)?;
    }
    let cgroup = targets::resolve(&req.target, state.cgroup2_mount())?;
    if !clear.is_empty() {
        let store = state.limits();
        let own = store.own(&cgroup);
        if let Some(missing) = clear.iter().find(|u| own.is_none_or(|l| !l.names_gpu(u))) {
            bail!(
                "{cgroup} has no limit of its own on {} (see `fgpu limit get {cgroup}`)",
                super::gpusel::describe(state.devices(), missing)
            );
        }
    }
    if req.until_cgroup_removed {
        let id = state
            .cgroup_id(&cgroup)
            .with_context(|| format!("cgroup {cgroup} is gone"))?;
        state.bind(&cgroup, id)?;
    }
    {
        let mut store = state.limits();
        if limit != Limit::default() {
            store.set(&cgroup, &limit)?;
        }
        if !clear.is_empty() {
            store.clear_gpus(&cgroup, &clear)?;
        }
        if let Some(pod) = &req.pod {
            keep_pod_name(&mut store, &cgroup, pod);
        }
    }
    super::apply::limits_changed(state);
    tracing::info!(
        event = "limit_set",
        cgroup,
        limit = ?limit,
        until_cgroup_removed = req.until_cgroup_removed,
        memory_bytes = limit.memory_bytes,
        memory_gpus = ?limit.memory_gpus,
        cleared_gpus = ?clear,
        compute_pct = limit.compute_pct,
        compute_cap_pct = limit.compute_cap_pct,
        compute_gpus = ?limit.compute_gpus,
        compute_cap_gpus = ?limit.compute_cap_gpus,
        door = caller.door.name(),
        uid = caller.peer.uid,
        pid = caller.peer.pid,
        caller_cgroup = caller.cgroup_or_dash(),
        "limit set"
    );
    reply(&entry(state, &cgroup))
}

fn limit_get(state: &State, req: &TargetRequest) -> Result<Frame> {
    let cgroup = targets::resolve(&req.target, state.cgroup2_mount())?;
    reply(&entry(state, &cgroup))
}

fn limit_list(state: &State) -> Result<Frame> {
    let paths: Vec<String> = state.limits().all().map(|(p, _)| p.clone()).collect();
    let entries: Vec<LimitEntry> = paths.iter().map(|p| entry(state, p)).collect();
    reply(&entries)
}

fn limit_remove(state: &State, caller: &Caller, req: &TargetRequest) -> Result<Frame> {
    // A cgroup removed since its limit was set can still have its limit removed.
    let cgroup = match targets::resolve(&req.target, state.cgroup2_mount()) {
        Ok(c) => c,
        Err(err) => {
            let literal = format!("/{}", req.target.trim().trim_matches('/'));
            if state.limits().own(&literal).is_none() {
                return Err(err);
            }
            literal
        }
    };
    let removed = state.limits().remove(&cgroup)?;
    super::apply::limits_changed(state);
    if removed.is_none() {
        bail!("{cgroup} has no limit of its own (see `fgpu limit get {cgroup}`)");
    }
    tracing::info!(
        event = "limit_removed",
        cgroup,
        door = caller.door.name(),
        uid = caller.peer.uid,
        pid = caller.peer.pid,
        caller_cgroup = caller.cgroup_or_dash(),
        "limit removed"
    );
    reply(&entry(state, &cgroup))
}

/// Keeps the name the kubelet plugin gave with a pod's limit, if `cgroup` is a pod's own
/// cgroup and the name a Kubernetes name; the limit stands either way.
fn keep_pod_name(store: &mut super::limits::LimitStore, cgroup: &str, pod: &PodName) {
    let is_pod = fgpu_common::cgroup::naming::identity(cgroup)
        .pod
        .is_some_and(|p| p.cgroup == cgroup);
    if !is_pod || !pod.is_valid() {
        tracing::warn!(
            cgroup,
            ?pod,
            "a pod name not kept: not a pod's cgroup, or not a name"
        );
    } else if let Err(err) = store.set_pod(cgroup, pod) {
        tracing::warn!(cgroup, "{err:#}");
    }
}

fn validate(state: &State, limit: &Limit) -> Result<()> {
    if *limit == Limit::default() {
        bail!("nothing to set: give --memory, --compute, --compute-cap or --park-after");
    }
    if limit.park_after_ms == Some(0) {
        bail!(
            "--park-after 0 would park a container the moment it pauses; give how long it must \
             leave the GPU alone first, e.g. 30s"
        );
    }
    if let Some(bytes) = limit.memory_bytes {
        if bytes == 0 {
            bail!(
                "a memory limit of 0 would refuse every allocation; to lift a limit use `fgpu limit rm`"
            );
        }
        if let Some(device) = state.gpus().largest_memory()
            && bytes > device
        {
            bail!(
                "memory limit {} is larger than the device ({} on the largest GPU of this node)",
                Size(bytes),
                Size(device)
            );
        }
    }
    for (uuid, &bytes) in &limit.memory_gpus {
        let gpu = super::gpusel::describe(state.devices(), uuid);
        if bytes == 0 {
            bail!(
                "a memory limit of 0 on {gpu} would refuse every allocation there; to lift it use \
                 `fgpu limit rm TARGET --gpu {uuid}`"
            );
        }
        if let Some(d) = state.devices().iter().find(|d| d.uuid == *uuid)
            && bytes > d.memory_total_bytes
        {
            bail!(
                "memory limit {} is larger than {gpu} ({})",
                Size(bytes),
                Size(d.memory_total_bytes)
            );
        }
    }
    for (name, plain, per_gpu) in [
        ("--compute", limit.compute_pct, &limit.compute_gpus),
        (
            "--compute-cap",
            limit.compute_cap_pct,
            &limit.compute_cap_gpus,
        ),
    ] {
        if let Some(p) = plain
            .into_iter()
            .chain(per_gpu.values().copied())
            .find(|p| !(1..=100).contains(p))
        {
            bail!("{name} {p}% is out of range: give 1-100%");
        }
    }
    Ok(())
}
