//! The JSON bodies of the control-socket requests and replies, shared by the agent and the
//! CLI (framing is `fgpu_common::proto`). Field names are a contract: add, never rename.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A cgroup's limit. `None` fields are not set (and inherit from an ancestor).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limit {
    /// GPU memory, on every GPU the cgroup uses (each GPU separately).
    pub memory_bytes: Option<u64>,
    /// GPU memory on one GPU, by NVML UUID (`GPU-...`): on that GPU it replaces
    /// `memory_bytes` of the same cgroup (`fgpu limit set --gpu`). An effective limit holds,
    /// for every GPU named anywhere on the way up, the lowest value that applies there.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub memory_gpus: BTreeMap<String, u64>,
    /// Guaranteed compute share, percent.
    pub compute_pct: Option<u8>,
    /// Hard compute ceiling, percent.
    pub compute_cap_pct: Option<u8>,
    /// Compute share on one GPU, by NVML UUID (`fgpu limit set --compute P --gpu X`): on
    /// that GPU it replaces `compute_pct` of the same cgroup. Inherited like `compute_pct`:
    /// per GPU, from the nearest cgroup that sets a value there (its own or its plain one).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub compute_gpus: BTreeMap<String, u8>,
    /// Compute ceiling on one GPU, by NVML UUID, as `compute_gpus` is to `compute_pct`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub compute_cap_gpus: BTreeMap<String, u8>,
    /// Compute priority class on every GPU (inherited from the nearest cgroup that sets it;
    /// `normal` when none does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_priority: Option<ComputePriority>,
    /// Parkable after this long without GPU use, ms (`fgpu limit set --park-after`,
    /// docs/parking.md); inherited from the nearest cgroup that sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub park_after_ms: Option<u64>,
}

/// A cgroup's compute priority class (`fgpu limit set --compute-priority`, docs/compute.md
/// "Priority").
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ComputePriority {
    /// Served first within its share: a high tenant that waits ends a normal or low
    /// tenant's turn after 2 ms; past its share it shares like a normal one.
    High,
    /// Shares the device with the other normal and high tenants by their shares.
    #[default]
    Normal,
    /// Only gets the device while no normal or high tenant wants it (idle time).
    Low,
}

impl ComputePriority {
    /// Every class, in the order `--help` lists them.
    pub const ALL: [ComputePriority; 3] = [
        ComputePriority::High,
        ComputePriority::Normal,
        ComputePriority::Low,
    ];

    /// The class named `s` (`high`, `normal`, `low`), as the CLI and the CDI environment
    /// write it.
    pub fn parse(s: &str) -> Option<ComputePriority> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ComputePriority::High => "high",
            ComputePriority::Normal => "normal",
            ComputePriority::Low => "low",
        }
    }
}

/// `fgpu limit set`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LimitSetRequest {
    /// A TARGET as the user wrote it (cgroup path or `pid:PID`); the agent resolves it.
    pub target: String,
    pub limit: Limit,
    /// Remove the limit when the cgroup is removed (a container's limit, set by the CDI hook
    /// as the container is created): no stale limit outlives its container.
    #[serde(default)]
    pub until_cgroup_removed: bool,
    /// Per-GPU memory limits as the user wrote the GPUs (`--gpu`: an NVML index, a UUID or a
    /// unique UUID prefix), resolved by the agent against its GPUs. `limit.memory_bytes` is
    /// unset then, so that an agent that predates per-GPU limits refuses the request
    /// ("nothing to set") instead of applying the value to every GPU.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub memory_gpus: BTreeMap<String, u64>,
    /// GPUs (as the user wrote them) whose own per-GPU memory value is removed (`fgpu limit
    /// rm TARGET --gpu X`): they fall back to the cgroup's plain limit, if any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clear_gpus: Vec<String>,
    /// Per-GPU compute shares and ceilings as the user wrote the GPUs (`--compute` /
    /// `--compute-cap` with `--gpu`), resolved like `memory_gpus`; the plain fields are unset
    /// then.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub compute_gpus: BTreeMap<String, u8>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub compute_cap_gpus: BTreeMap<String, u8>,
    /// The Kubernetes pod whose own cgroup `target` is (the kubelet plugin's pod limits):
    /// the agent keeps its namespace and name with the limit, for the status report. Not
    /// kept for a target that is not a pod's cgroup; never part of the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodName>,
}

/// A Kubernetes pod's namespace and name (display only: no limit depends on them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodName {
    pub namespace: String,
    pub name: String,
}

impl PodName {
    /// Whether both are Kubernetes object names ([`is_object_name`]): nothing else is kept,
    /// so that they print as they are.
    pub fn is_valid(&self) -> bool {
        is_object_name(&self.namespace) && is_object_name(&self.name)
    }
}

/// A Kubernetes object name (DNS subdomain: lower-case letters, digits, `-` and `.`, at most
/// 253).
pub fn is_object_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 253
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

impl Limit {
    /// The memory limit on the GPU of NVML UUID `uuid`: its own value, else `memory_bytes`.
    pub fn memory_on(&self, uuid: &str) -> Option<u64> {
        self.memory_gpus.get(uuid).copied().or(self.memory_bytes)
    }

    /// Whether any memory limit is set (on every GPU or on some).
    pub fn has_memory(&self) -> bool {
        self.memory_bytes.is_some() || !self.memory_gpus.is_empty()
    }

    /// The compute share on the GPU of NVML UUID `uuid`: its own value, else `compute_pct`.
    pub fn compute_on(&self, uuid: &str) -> Option<u8> {
        self.compute_gpus.get(uuid).copied().or(self.compute_pct)
    }

    /// The compute ceiling on the GPU of NVML UUID `uuid`.
    pub fn compute_cap_on(&self, uuid: &str) -> Option<u8> {
        self.compute_cap_gpus
            .get(uuid)
            .copied()
            .or(self.compute_cap_pct)
    }

    /// Whether any compute setting is made (on every GPU or on some).
    pub fn has_compute(&self) -> bool {
        self.compute_priority.is_some()
            || self.compute_pct.is_some()
            || self.compute_cap_pct.is_some()
            || !self.compute_gpus.is_empty()
            || !self.compute_cap_gpus.is_empty()
    }

    /// Whether it holds a per-GPU value (memory, share or ceiling) for `uuid`.
    pub fn names_gpu(&self, uuid: &str) -> bool {
        self.memory_gpus.contains_key(uuid)
            || self.compute_gpus.contains_key(uuid)
            || self.compute_cap_gpus.contains_key(uuid)
    }
}

/// `fgpu limit get` / `fgpu limit rm`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetRequest {
    pub target: String,
}

/// One cgroup's limits, as `fgpu limit get|ls|set|rm` print them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitEntry {
    /// The resolved cgroup path.
    pub cgroup: String,
    /// The limit set on this cgroup itself.
    pub own: Limit,
    /// What applies, including fields inherited from ancestors.
    pub effective: Limit,
    /// The cgroup whose memory limit applies, when one does.
    pub memory_limit_from: Option<String>,
}
