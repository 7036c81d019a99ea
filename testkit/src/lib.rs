//! What fgpu's privileged end-to-end tests share (a dev-dependency of the agent and shim
//! tests): the root check, unique names, cgroups in the v2 hierarchy, entering a cgroup at
//! exec, the host-wide monotonic clock, a real agent process ([`agent`]) and the check of
//! compute shares measured on the simulated device ([`shares`]).
//!
//! Tests named `privileged_*` need root. Without root they fail, unless
//! `FGPU_SKIP_PRIVILEGED=1` asks to skip them (what `cargo xtask test --unprivileged` does).

pub mod agent;
pub mod shares;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// True if the test may run; false if it is explicitly skipped; panics if it cannot run.
pub fn privileged() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var_os("FGPU_SKIP_PRIVILEGED").is_some() {
        eprintln!("SKIPPED: not root and FGPU_SKIP_PRIVILEGED is set");
        return false;
    }
    panic!("this test needs root (eBPF, cgroups, PID namespaces); run `sudo -E cargo xtask test`");
}

/// A name unique to this test run.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// CLOCK_MONOTONIC in nanoseconds (the same in every PID namespace of the host).
pub use fgpu_common::clock::mono_ns;

/// Where the cgroup v2 hierarchy is mounted on this host.
pub fn cgroup2_mount() -> PathBuf {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("reading mountinfo");
    fgpu_common::cgroup::cgroup2_mount(&info).expect("no cgroup2 mount")
}

/// A cgroup created for one test; its processes are killed and it is removed on drop.
pub struct Cgroup {
    pub dir: PathBuf,
    /// The path as fgpu names it (relative to the v2 root).
    pub path: String,
}

impl Cgroup {
    /// SIGKILLs every process in the cgroup (`cgroup.kill`); the cgroup stays.
    pub fn kill(&self) {
        let _ = std::fs::write(self.dir.join("cgroup.kill"), "1");
    }

    /// `name` may contain `/` (a child of another test cgroup).
    pub fn new(name: &str) -> Self {
        let dir = cgroup2_mount().join(name);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        Self {
            dir,
            path: format!("/{name}"),
        }
    }

    /// Host PIDs in the cgroup.
    pub fn procs(&self) -> Vec<u32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// The cgroup's id (the inode of its directory), as the kernel side reports it.
    pub fn id(&self) -> u64 {
        std::fs::metadata(&self.dir)
            .expect("cgroup directory")
            .ino()
    }

    /// Makes `cmd` join this cgroup between fork and exec (before it runs anything).
    pub fn enter_on_exec(&self, cmd: &mut Command) {
        let procs = CString::new(self.dir.join("cgroup.procs").as_os_str().as_bytes())
            .expect("cgroup path without NUL");
        // SAFETY: the closure only calls async-signal-safe functions (open, write, close)
        // on memory prepared before fork.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if ok { Ok(()) } else { Err(err) }
            });
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::remove_dir(&self.dir).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A Kubernetes tool (`helm`, `kubectl`, `kubernetes-validate`): in `$FGPU_K8S_TOOLS`,
/// `/opt/fgpu-k8s-tools` (deploy/helm/fetch-tools.sh puts them there) or `PATH`.
pub fn k8s_tool(tool: &str) -> Option<PathBuf> {
    std::env::var_os("FGPU_K8S_TOOLS")
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from("/opt/fgpu-k8s-tools")])
        .chain(
            std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
                .unwrap_or_default(),
        )
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}
