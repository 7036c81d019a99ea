//! The JSON bodies of the control-socket requests and replies, shared by the agent and the
//! CLI (framing is `fgpu_common::proto`). Field names are a contract: add, never rename.

use serde::{Deserialize, Serialize};

/// A cgroup's limit. `None` fields are not set (and inherit from an ancestor).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limit {
    pub memory_bytes: Option<u64>,
    /// Guaranteed compute share, percent.
    pub compute_pct: Option<u8>,
    /// Hard compute ceiling, percent.
    pub compute_cap_pct: Option<u8>,
}

/// `fgpu limit set`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LimitSetRequest {
    /// A TARGET as the user wrote it (cgroup path or `pid:PID`); the agent resolves it.
    pub target: String,
    pub limit: Limit,
    /// Remove the limit when the cgroup is removed (a container's limit, set by the CDI hook
    /// as the container is created): no stale limit outlives its container.
    #[serde(default)]
    pub until_cgroup_removed: bool,
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
