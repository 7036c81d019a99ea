//! `fgpu run`: run a command in a fresh cgroup with GPU limits, like a one-off container.
//!
//! The cgroup is made under `<cgroup2 mount>/fgpu/`, its limits are set through the agent,
//! the command runs with the shim preloaded, signals are passed on, and when it ends the
//! cgroup (and its limits) are removed and fgpu exits with the command's status. Without an
//! agent the limits are given to the shim through the environment instead (standalone
//! mode), with a warning.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use clap::Args;
use fgpu_common::cgroup::cgroup2_mount;
use fgpu_common::proto::Kind;
use fgpu_common::quantity::{Size, parse_percent, parse_size};

use crate::api::{Limit, LimitSetRequest, TargetRequest};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// GPU memory limit for the command and everything it starts, e.g. 8GiB.
    #[arg(long, value_name = "SIZE", value_parser = |s: &str| parse_size(s).map_err(|e| e.to_string()))]
    memory: Option<u64>,

    /// Guaranteed share of the GPU's compute time, e.g. 30%: the command gets at least this
    /// much when it wants it, and more when others leave the GPU idle. Without an agent it
    /// becomes a ceiling (the shim alone cannot know what others leave).
    #[arg(long, value_name = "PCT", value_parser = |s: &str| parse_percent(s).map_err(|e| e.to_string()))]
    compute: Option<u8>,

    /// Hard ceiling on the command's compute time, e.g. 50%, kept even on an idle GPU.
    #[arg(long, value_name = "PCT", value_parser = |s: &str| parse_percent(s).map_err(|e| e.to_string()))]
    compute_cap: Option<u8>,

    /// Name of the cgroup to create under fgpu/ (default: run-<pid>); must not exist.
    #[arg(long, value_name = "NAME")]
    name: Option<String>,

    /// The agent socket to ask [default: $FGPU_ADMIN_SOCKET, else the admin socket
    /// /run/fgpu-admin/fgpu.sock, else (inside a container, where only the containers' socket
    /// is mounted) $FGPU_SOCKET or /run/fgpu/fgpu.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,

    /// The socket the command's shim says Hello on [default: $FGPU_SOCKET or
    /// /run/fgpu/fgpu.sock, the agent's containers' socket].
    #[arg(long, value_name = "PATH")]
    shim_socket: Option<PathBuf>,

    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Signals passed on to the command.
const FORWARDED: [i32; 6] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

pub fn run(args: &RunArgs) -> Result<std::process::ExitCode> {
    if let Some(name) = &args.name
        && (name.is_empty() || name.contains('/') || name == "." || name == "..")
    {
        bail!("--name {name:?}: give a plain name (it becomes fgpu/<name> in the cgroup tree)");
    }
    let socket = crate::socket_path(args.socket.clone());
    let shim = find_shim()?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mount = cgroup2_mount(&mountinfo).context("no cgroup v2 hierarchy is mounted")?;
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| format!("run-{}", std::process::id()));
    let cgroup = Cgroup::create(&mount, &name)?;

    let limit = Limit {
        memory_bytes: args.memory,
        compute_pct: args.compute,
        compute_cap_pct: args.compute_cap,
        ..Limit::default()
    };
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..]);
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(existing) if !existing.is_empty() => format!("{}:{existing}", shim.display()),
        _ => shim.display().to_string(),
    };
    let shim_socket = args
        .shim_socket
        .clone()
        .unwrap_or_else(crate::containers_socket);
    cmd.env("LD_PRELOAD", preload)
        .env("FGPU_SOCKET", &shim_socket);

    let with_agent = limit == Limit::default() || set_limit(&socket, &cgroup.path, &limit);
    if !with_agent {
        eprintln!(
            "fgpu: no fgpu agent at {}: falling back to standalone limits (the shim enforces {}; \
             nothing outside the shim is watched)",
            socket.display(),
            describe(&limit)
        );
        if let Some(m) = limit.memory_bytes {
            cmd.env("FGPU_MEMORY_LIMIT", m.to_string());
        }
        // Standalone, a share can only be a ceiling; the cap wins when both are given.
        if let Some(c) = limit.compute_cap_pct.or(limit.compute_pct) {
            cmd.env("FGPU_COMPUTE_SHARE", c.to_string());
        }
        // One ledger per run: other runs of the same user must not share this one's limit.
        cmd.env("FGPU_LEDGER", format!("/dev/shm/fgpu-run-{name}"));
    }

    let status = run_in(&cgroup, cmd, &args.command[0]);
    if with_agent && limit != Limit::default() {
        let req = TargetRequest {
            target: cgroup.path.clone(),
        };
        let _ = super::client::request(
            &socket,
            Kind::LimitRemove,
            Bytes::from(serde_json::to_vec(&req)?),
            Kind::LimitReply,
        );
    } else {
        let _ = std::fs::remove_file(format!("/dev/shm/fgpu-run-{name}"));
    }
    drop(cgroup);
    let status = status?;
    Ok(std::process::ExitCode::from(
        match (status.code(), status.signal()) {
            (Some(code), _) => code as u8,
            (None, Some(sig)) => (128 + sig) as u8,
            _ => 1,
        },
    ))
}

fn describe(limit: &Limit) -> String {
    let mut parts = Vec::new();
    if let Some(m) = limit.memory_bytes {
        parts.push(format!("memory {}", Size(m)));
    }
    if let Some(c) = limit.compute_pct {
        parts.push(format!("compute {c}% (as a ceiling)"));
    }
    if let Some(c) = limit.compute_cap_pct {
        parts.push(format!("compute cap {c}%"));
    }
    parts.join(", ")
}

/// Sets the limit through the agent; false if there is no agent to talk to. Any other
/// refusal (a limit above the device, say) is reported and ends the run.
fn set_limit(socket: &Path, cgroup: &str, limit: &Limit) -> bool {
    let req = LimitSetRequest {
        target: cgroup.to_string(),
        limit: limit.clone(),
        until_cgroup_removed: false,
        ..LimitSetRequest::default()
    };
    let body = Bytes::from(serde_json::to_vec(&req).unwrap_or_default());
    match super::client::request(socket, Kind::LimitSet, body, Kind::LimitReply) {
        Ok(_) => true,
        Err(err) if err.to_string().contains("agent is not running") => false,
        Err(err) => {
            eprintln!("fgpu: error: {err:#}");
            std::process::exit(1);
        }
    }
}

/// Starts the command inside the cgroup, passes signals on, and waits for it.
fn run_in(cgroup: &Cgroup, mut cmd: Command, program: &str) -> Result<std::process::ExitStatus> {
    let procs = CString::new(cgroup.dir.join("cgroup.procs").as_os_str().as_bytes())?;
    // Block the forwarded signals here; a thread takes them with sigwait and passes them on.
    // SAFETY: plain signal-set manipulation on a local set.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in FORWARDED {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    // SAFETY: the closure runs between fork and exec and only calls async-signal-safe
    // functions (open, write, close, sigprocmask) on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
            let err = std::io::Error::last_os_error();
            libc::close(fd);
            if !ok {
                return Err(err);
            }
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            Ok(())
        });
    }
    let mut child = cmd.spawn().with_context(|| format!("starting {program}"))?;
    let pid = child.id() as i32;
    std::thread::Builder::new()
        .name("fgpu-run-signals".into())
        .spawn(move || {
            loop {
                let mut sig = 0;
                // SAFETY: sigwait on a valid set, writing the signal number into `sig`.
                if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                    // SAFETY: kill(2) on our own child.
                    unsafe { libc::kill(pid, sig) };
                }
            }
        })?;
    Ok(child.wait()?)
}

/// The shim to preload: `$FGPU_SHIM`, or next to this binary (`target/<profile>/`), or the
/// bundle's `lib/`, or the usual install locations.
fn find_shim() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("FGPU_SHIM") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!("FGPU_SHIM={} does not exist", p.display());
    }
    let exe = std::env::current_exe()?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [
        dir.join("libfgpu.so"),
        dir.join("../lib/libfgpu.so"),
        PathBuf::from("/usr/local/lib/fgpu/libfgpu.so"),
        PathBuf::from("/usr/lib/fgpu/libfgpu.so"),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .map(|p| p.canonicalize().unwrap_or_else(|_| p.clone()))
        .with_context(|| {
            format!(
                "libfgpu.so not found (looked next to {} and in /usr/local/lib/fgpu, \
                 /usr/lib/fgpu): build it (`cargo xtask build`) or set FGPU_SHIM",
                exe.display()
            )
        })
}

/// The run's cgroup; removed (after killing anything left in it) on drop.
struct Cgroup {
    dir: PathBuf,
    path: String,
}

impl Cgroup {
    fn create(mount: &Path, name: &str) -> Result<Self> {
        let parent = mount.join("fgpu");
        std::fs::create_dir_all(&parent).with_context(|| {
            format!(
                "creating {} (fgpu run needs root to make cgroups)",
                parent.display()
            )
        })?;
        let dir = parent.join(name);
        std::fs::create_dir(&dir).with_context(|| match std::fs::metadata(&dir) {
            Ok(_) => format!("cgroup fgpu/{name} already exists: pick another --name"),
            Err(_) => format!("creating cgroup {}", dir.display()),
        })?;
        Ok(Self {
            dir,
            path: format!("/fgpu/{name}"),
        })
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Whatever the command left behind (daemonised children) goes with it.
        let _ = std::fs::write(self.dir.join("cgroup.kill"), "1");
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::remove_dir(&self.dir).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if self.dir.exists() {
            eprintln!("fgpu: could not remove cgroup {}", self.dir.display());
        }
    }
}
