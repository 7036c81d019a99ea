//! libfgpu
