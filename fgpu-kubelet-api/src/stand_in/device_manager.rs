//! The kubelet's device manager at start, as a device plugin meets it.
//!
//! kubernetes/kubernetes pkg/kubelet/cm/devicemanager/manager.go (read at commit 7510f329):
//! `Start` reads the checkpoint and starts the registration server
//! (plugin/v1beta1/server.go, `Start`), which first calls the manager's
//! `CleanupPluginDirectory` on the device-plugins directory and then listens on a new
//! `kubelet.sock`. `CleanupPluginDirectory` goes through the directory's entries (not into
//! subdirectories) and removes each that is a Unix socket (`os.Stat`, so a link to a socket
//! counts as one), except the checkpoint `kubelet_internal_checkpoint`; directories and other
//! files stay, and an entry that cannot be read is skipped. Plugins watch their sockets: one
//! that is gone means a new kubelet, and they register again on the new `kubelet.sock`.
//! Older kubelets (`removeContents`, before the registration server moved to
//! plugin/v1beta1) removed every entry but directories and the checkpoint; the sockets go
//! either way.
//!
//! Serving the new `kubelet.sock` is left to the caller: a one-shot command cannot.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// The device manager's checkpoint file in the device-plugins directory
/// (`kubeletDeviceManagerCheckpoint`), which a restart keeps.
pub const CHECKPOINT: &str = "kubelet_internal_checkpoint";

/// The kubelet's socket for device-plugin registrations, in the same directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";

/// `CleanupPluginDirectory(dir)`: removes every socket in `dir` but the checkpoint, and
/// returns the paths it removed (sorted). An error if `dir` cannot be read, or if a socket
/// could not be removed (the others are removed all the same, as upstream aggregates them).
pub fn cleanup_plugin_directory(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut names: Vec<_> = entries.flatten().map(|e| e.file_name()).collect();
    names.sort();
    let mut removed = Vec::new();
    let mut errors = Vec::new();
    for name in names {
        if name == CHECKPOINT {
            continue;
        }
        let path = dir.join(&name);
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() || !meta.file_type().is_socket() {
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => removed.push(path),
            Err(e) => errors.push(format!("{}: {e}", path.display())),
        }
    }
    if errors.is_empty() {
        Ok(removed)
    } else {
        Err(errors.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_sockets_go_and_the_checkpoint_stays() {
        let dir = std::env::temp_dir().join(format!("fgpu-dm-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let _a = std::os::unix::net::UnixListener::bind(dir.join("a.sock")).unwrap();
        let _k = std::os::unix::net::UnixListener::bind(dir.join(KUBELET_SOCKET)).unwrap();
        let _s = std::os::unix::net::UnixListener::bind(dir.join("sub/b.sock")).unwrap();
        std::fs::write(dir.join(CHECKPOINT), "{}").unwrap();
        std::fs::write(dir.join("notes"), "").unwrap();
        let removed = cleanup_plugin_directory(&dir).unwrap();
        assert_eq!(removed, [dir.join("a.sock"), dir.join(KUBELET_SOCKET)]);
        assert!(dir.join(CHECKPOINT).is_file());
        assert!(dir.join("notes").is_file(), "not a socket");
        assert!(
            dir.join("sub/b.sock").exists(),
            "not in the directory itself"
        );
        let err = cleanup_plugin_directory(&dir.join("missing")).unwrap_err();
        assert!(err.contains("missing"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
