//! The agent's peer-facing decoders, compiled from the agent's own sources (the agent is a
//! binary crate) so that the fuzz targets exercise exactly the code the agent runs.

#[path = "../../fgpu-agent/src/api.rs"]
pub mod api;

#[path = "../../fgpu-agent/src/agent/request.rs"]
pub mod request;

#[path = "../../fgpu-agent/src/agent/targets.rs"]
pub mod targets;

#[path = "../../fgpu-agent/src/agent/containers.rs"]
pub mod containers;
