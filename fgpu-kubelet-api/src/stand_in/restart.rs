//! A kubelet restart as plugins meet it, in the order the kubelet's start reaches them:
//!
//! 1. the device manager starts: the device-plugins directory loses its sockets, the
//!    checkpoint stays ([`super::device_manager`]);
//! 2. the DRA plugin manager is made and wipes the node's ResourceSlices, all drivers'
//!    ([`super::resource_slices`]);
//! 3. the plugin watcher starts: every registration socket found in plugins_registry is
//!    dialled and its plugin registered again ([`super::plugin_watcher`]).
//!
//! Each step is done for the parts given (a directory, an API server), and reported as
//! [`Event`]s while it runs. What a restarted kubelet does next and this does not: serve a new
//! `kubelet.sock` (a one-shot command cannot; the end-to-end tests do), watch the directories,
//! retry registrations, and wipe a driver's slices 30 s after its plugin went away.

use std::path::PathBuf;

use super::{device_manager, plugin_watcher, resource_slices};

/// The parts of the node a restart touches.
#[derive(Debug, Clone, Default)]
pub struct Restart {
    /// The device-plugins directory (`/var/lib/kubelet/device-plugins`).
    pub device_plugins_dir: Option<PathBuf>,
    /// The plugin watcher's directory (`/var/lib/kubelet/plugins_registry`).
    pub registry_dir: Option<PathBuf>,
    /// The API server (plain http) and the node's name, for the slices' wipe.
    pub api: Option<(String, String)>,
    /// The most attempts of the wipe (see [`resource_slices::wipe_resource_slices`]).
    pub wipe_attempts: u32,
}

/// One thing a restart did (or failed to do).
#[derive(Debug, Clone)]
pub enum Event {
    /// A device plugin's socket removed from the device-plugins directory.
    Removed(PathBuf),
    /// The node's slices deleted.
    Wiped(resource_slices::Wiped),
    /// A plugin registered again, or refused (its `error`).
    Registered(plugin_watcher::Registration),
    /// A step that failed as a whole (an unreadable directory, an API server that never
    /// answered): what, and why.
    Failed(&'static str, String),
}

impl Event {
    /// As one JSON line of `fgpu-test-kubelet restart`.
    pub fn json(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            Event::Removed(p) => json!({"removed": p.display().to_string()}),
            Event::Wiped(w) => json!({"deleted_slices": w.deleted,
                                      "field_selector": w.field_selector, "attempts": w.attempts}),
            Event::Registered(r) => r.json(),
            Event::Failed(step, e) => json!({"failed": step, "error": e}),
        }
    }

    /// Whether this is a failure (a refused registration included).
    pub fn failed(&self) -> bool {
        match self {
            Event::Failed(..) => true,
            Event::Registered(r) => r.error.is_some(),
            _ => false,
        }
    }
}

impl Restart {
    /// Restarts the kubelet's side of the parts given; `report` gets each event as it happens.
    /// Returns whether every step succeeded.
    pub async fn run(&self, mut report: impl FnMut(&Event)) -> bool {
        let mut ok = true;
        let mut emit = |e: Event| {
            ok &= !e.failed();
            report(&e);
        };
        if let Some(dir) = &self.device_plugins_dir {
            match device_manager::cleanup_plugin_directory(dir) {
                Ok(removed) => removed.into_iter().for_each(|p| emit(Event::Removed(p))),
                Err(e) => emit(Event::Failed("device-plugins", e)),
            }
        }
        if let Some((url, node)) = self.api.clone() {
            let attempts = self.wipe_attempts;
            let wiped = tokio::task::spawn_blocking(move || {
                resource_slices::wipe_resource_slices(&url, &node, attempts)
            })
            .await
            .unwrap_or_else(|e| Err(e.to_string()));
            match wiped {
                Ok(w) => emit(Event::Wiped(w)),
                Err(e) => emit(Event::Failed("resource-slices", e)),
            }
        }
        if let Some(dir) = &self.registry_dir {
            match plugin_watcher::sockets(dir) {
                Ok(socks) => {
                    for s in socks {
                        emit(Event::Registered(plugin_watcher::register(&s).await));
                    }
                }
                Err(e) => emit(Event::Failed("plugins-registry", e)),
            }
        }
        ok
    }
}
