//! A TARGET as a peer writes it (`limit set/get/rm`), resolved as the agent resolves it, and
//! the `/proc/PID/cgroup` text parser it relies on. Resolution looks only under a cgroup mount
//! that does not exist here, and at /proc for `pid:` forms: it reads, never writes.
#![no_main]

use std::path::Path;

use fgpu_fuzz::targets;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = fgpu_common::cgroup::unified_path(text);
    if let Ok(path) = targets::resolve(text, Path::new("/nonexistent-fgpu-fuzz-cgroup")) {
        // Only `pid:` forms can resolve here; the result is a clean absolute path.
        assert!(path.starts_with('/'), "{path}");
        assert!(!path.contains("/../"), "{path}");
    }
});
