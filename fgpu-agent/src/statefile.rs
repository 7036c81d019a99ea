//! Writing a file so that readers (and a crash) see the old contents or the new, never a
//! torn mix: the limits store, the container bindings, generated CDI specs.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Writes `bytes` to `tmp` (mode `mode`), syncs it, renames it over `path` and syncs the
/// directory, so that the rename itself survives a crash.
pub fn write_atomic(path: &Path, tmp: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
