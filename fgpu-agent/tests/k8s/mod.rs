//! The Kubernetes side of the end-to-end tests: a stand-in API server and a test kubelet.
#![allow(dead_code)]

pub mod apiserver;
pub mod kubelet;
pub mod plugin;
pub mod validate;
