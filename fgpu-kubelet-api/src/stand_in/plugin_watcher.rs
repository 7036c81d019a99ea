//! The kubelet's plugin watcher and its registration of a plugin, as a plugin meets them.
//!
//! - At start (kubernetes/kubernetes pkg/kubelet/pluginmanager/pluginwatcher/plugin_watcher.go,
//!   `Start` → `traversePluginDir`) the kubelet walks the plugins_registry directory, into
//!   subdirectories, in lexical order, and hands every Unix socket it finds to registration
//!   as if it had just been created (`handleCreateEvent`); a socket whose file name starts
//!   with '.' is ignored, and so is anything that is not a socket. [`sockets`] is that walk.
//! - Registration (pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go,
//!   `GenerateRegisterPluginFunc`): dial the socket (10 s), GetInfo (1 s), find the handler
//!   for `PluginInfo.type`, an empty endpoint becomes the socket's path, the handler validates
//!   the plugin, registers it, and the plugin is told with NotifyRegistrationStatus (5 s):
//!   `plugin_registered: true`, or false with the error of the step that failed (upstream's
//!   messages). [`register`] does that with the one handler this stand-in has, the DRA one
//!   (pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go, `ValidatePlugin` and
//!   `validateSupportedServices`: the first of the plugin's `supported_versions` that the
//!   kubelet speaks, `v1.DRAPlugin` or `v1beta1.DRAPlugin` (dra_plugin.go,
//!   `servicesSupportedByKubelet`), else the plugin is refused). A real kubelet also has
//!   handlers for CSI and device plugins; here those types are refused as a kubelet without
//!   the handler refuses them.
//!
//! What the stand-in does not do: watch the directory afterwards (a socket created or
//! removed later is not seen), and retry a failed registration (the kubelet's reconciler
//! does, each second).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::pluginregistration as reg;

/// The plugin types the stand-in registers (the kubelet's DRA handler).
const HANDLED: &[&str] = &[crate::DRA_PLUGIN_TYPE];
/// The DRA services the kubelet speaks, newest first.
const DRA_SERVICES: &[&str] = &[crate::DRA_V1_VERSION, crate::DRA_V1BETA1_VERSION];

const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
const GET_INFO_TIMEOUT: Duration = Duration::from_secs(1);
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);

/// The sockets the plugin watcher finds in `dir` at start, in the order it registers them.
/// An error if `dir` itself cannot be read (upstream's one fatal case of the walk).
pub fn sockets(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut found = Vec::new();
    walk(dir, &mut found).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(found)
}

fn walk(dir: &Path, found: &mut Vec<PathBuf>) -> std::io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let mut entries: Vec<_> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for path in entries {
        // The walk does not follow links to directories; a socket is judged by `os.Stat`.
        let Ok(lmeta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if lmeta.is_dir() {
            // A subdirectory that cannot be read is skipped (logged upstream).
            let _ = walk(&path, found);
            continue;
        }
        let hidden = path
            .file_name()
            .is_some_and(|n| n.as_encoded_bytes().starts_with(b"."));
        if !hidden && std::fs::metadata(&path).is_ok_and(|m| m.file_type().is_socket()) {
            found.push(path);
        }
    }
    Ok(())
}

/// What registering the plugin on one socket came to.
#[derive(Debug, Clone)]
pub struct Registration {
    pub socket: PathBuf,
    /// The plugin's GetInfo answer (the endpoint filled in as the kubelet does), if it gave one.
    pub info: Option<reg::PluginInfo>,
    /// For a DRA plugin that was registered: the service the kubelet chose.
    pub service: Option<String>,
    /// Why the plugin is not registered; `None` when it is.
    pub error: Option<String>,
}

impl Registration {
    /// As a JSON object (the `fgpu-test-kubelet` output).
    pub fn json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "socket": self.socket.display().to_string(),
            "registered": self.error.is_none(),
        });
        if let Some(i) = &self.info {
            v["type"] = i.r#type.clone().into();
            v["name"] = i.name.clone().into();
            v["endpoint"] = i.endpoint.clone().into();
            v["supported_versions"] = i.supported_versions.clone().into();
        }
        if let Some(s) = &self.service {
            v["service"] = s.clone().into();
        }
        if let Some(e) = &self.error {
            v["error"] = e.clone().into();
        }
        v
    }
}

/// Registers the plugin whose registration socket is `socket`, as the kubelet's plugin
/// manager does; the plugin is told the outcome unless it could not be reached.
pub async fn register(socket: &Path) -> Registration {
    let mut r = Registration {
        socket: socket.to_path_buf(),
        info: None,
        service: None,
        error: None,
    };
    let at = socket.display();
    let channel = match tokio::time::timeout(DIAL_TIMEOUT, super::channel(socket)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            let mut e: &dyn std::error::Error = &e;
            let mut why = e.to_string();
            while let Some(s) = e.source() {
                if !why.ends_with(&s.to_string()) {
                    why = format!("{why}: {s}");
                }
                e = s;
            }
            r.error = Some(format!(
                "RegisterPlugin error -- dial failed at socket {at}, err: {why}"
            ));
            return r;
        }
        Err(_) => {
            r.error = Some(format!(
                "RegisterPlugin error -- dial failed at socket {at}, err: timed out"
            ));
            return r;
        }
    };
    let mut c = reg::registration_client::RegistrationClient::new(channel);
    let mut info = match within(GET_INFO_TIMEOUT, c.get_info(reg::InfoRequest {})).await {
        Ok(i) => i,
        Err(e) => {
            r.error = Some(format!(
                "RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {at}, err: {e}"
            ));
            return r;
        }
    };
    if info.endpoint.is_empty() {
        info.endpoint = socket.display().to_string();
    }
    let refusal = if !HANDLED.contains(&info.r#type.as_str()) {
        Some(format!(
            "RegisterPlugin error -- no handler registered for plugin type: {} at socket {at}",
            info.r#type
        ))
    } else {
        match dra_service(&info.supported_versions) {
            Ok(s) => {
                r.service = Some(s.to_string());
                None
            }
            Err(e) => Some(format!(
                "RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC versions of DRA driver plugin {} at endpoint {}: {e}",
                info.name, info.endpoint
            )),
        }
    };
    r.info = Some(info);
    let status = reg::RegistrationStatus {
        plugin_registered: refusal.is_none(),
        error: refusal.clone().unwrap_or_default(),
    };
    let notified = within(NOTIFY_TIMEOUT, c.notify_registration_status(status)).await;
    r.error = match (refusal, notified) {
        (None, Ok(_)) => None,
        (None, Err(e)) => {
            r.service = None;
            Some(format!(
                "RegisterPlugin error -- failed to send registration status at socket {at}, err: {e}"
            ))
        }
        (Some(why), Ok(_)) => Some(why),
        (Some(why), Err(e)) => Some(format!("{why}: {e}")),
    };
    r
}

/// A call's answer, or its error (a timeout as `DeadlineExceeded`, as gRPC's context gives it).
async fn within<T>(
    limit: Duration,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, tonic::Status> {
    match tokio::time::timeout(limit, call).await {
        Ok(r) => r.map(tonic::Response::into_inner),
        Err(_) => Err(tonic::Status::deadline_exceeded(
            "context deadline exceeded",
        )),
    }
}

/// `validateSupportedServices`: the first of the plugin's services the kubelet speaks.
fn dra_service(supported: &[String]) -> Result<&'static str, String> {
    if supported.is_empty() {
        return Err("empty list of supported gRPC services (aka supported versions)".into());
    }
    supported
        .iter()
        .find_map(|s| DRA_SERVICES.iter().find(|k| *k == s).copied())
        .ok_or_else(|| {
            format!(
                "none of services supported by the plugin ({supported:?}) are supported by the kubelet ({DRA_SERVICES:?})"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walk_finds_sockets_in_order_and_skips_hidden_ones_and_files() {
        let dir = std::env::temp_dir().join(format!("fgpu-pw-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("d")).unwrap();
        let bind = |p: &str| std::os::unix::net::UnixListener::bind(dir.join(p)).unwrap();
        let _l = [
            bind("b-reg.sock"),
            bind("a-reg.sock"),
            bind(".x.sock"),
            bind("d/c.sock"),
        ];
        std::fs::write(dir.join("file"), "").unwrap();
        assert_eq!(
            sockets(&dir).unwrap(),
            [
                dir.join("a-reg.sock"),
                dir.join("b-reg.sock"),
                dir.join("d/c.sock")
            ]
        );
        assert!(sockets(&dir.join("missing")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_first_service_of_the_plugins_that_the_kubelet_speaks_is_chosen() {
        let s = |v: &[&str]| dra_service(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            s(&["v2.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAPlugin"]),
            Ok("v1beta1.DRAPlugin")
        );
        assert_eq!(s(&["v1.DRAPlugin"]), Ok("v1.DRAPlugin"));
        assert!(s(&[]).unwrap_err().starts_with("empty list"));
        assert!(s(&["1.0.0"]).unwrap_err().starts_with("none of services"));
    }
}
