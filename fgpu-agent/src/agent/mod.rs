//! `fgpu agent`: the node daemon.
//!
//! Start-up: check the host ([`preflight`]), load the eBPF object and attach it to the
//! driver libraries ([`discovery`], [`probes`]), then serve the control socket
//! ([`server`]) and drain the event ring buffer ([`events`]) until SIGINT/SIGTERM.

mod adopt;
mod apply;
mod backstop;
mod bound;
mod budget;
mod cgroups;
mod compute;
mod containers;
mod control;
mod devmap;
pub(crate) mod discovery;
mod doors;
mod enforce;
mod enforcer;
mod events;
mod gpus;
mod gpusel;
mod hostns;
mod kernel;
mod ledgers;
mod limits;
pub(crate) mod logging;
pub(crate) mod metrics;
mod ownpod;
mod park;
mod pathindex;
mod peer;
mod pidfd;
mod pins;
mod preflight;
mod probes;
mod publisher;
mod reclaim;
mod report;
mod request;
mod scm;
pub(crate) mod server;
mod shared;
mod shims;
mod smi;
mod state;
mod targets;
mod tenant;
mod unseen;
mod watcher;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};
use clap::Args;
use fgpu_common::event::Driver;

use self::discovery::LIBCUDA;
use self::watcher::Watcher;

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// The containers' socket: shims say Hello here and a caller may read its own cgroup's
    /// status, nothing else. Mode 0666; keep it alone in its directory and mount that
    /// directory (read-only is fine) into containers.
    #[arg(long, value_name = "PATH", default_value = crate::DEFAULT_SOCKET)]
    socket: PathBuf,

    /// The admin socket: limits (set/get/ls/rm) and every cgroup's status, for root on the
    /// host (callers must share the agent's PID, mount and user namespaces). Mode 0600 in a
    /// directory of its own: never mount it into containers.
    #[arg(long, value_name = "PATH", default_value = crate::DEFAULT_ADMIN_SOCKET)]
    admin_socket: PathBuf,

    /// Connections the containers' socket holds open at once (each shim keeps one).
    #[arg(long, value_name = "N", default_value_t = 4096,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,

    /// Connections one tenant (its container or pod cgroup, or the nearest limited cgroup
    /// below that, whatever sub-cgroups it makes) may hold open on the containers' socket at
    /// once; more are refused with an error.
    #[arg(long, value_name = "N", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_connections_per_cgroup: u32,

    /// Ledgers one tenant (as for --max-connections-per-cgroup) may hold at once: one per
    /// cgroup whose processes say Hello. Past it a Hello from yet another of its cgroups is
    /// refused with an error (the shim then follows FGPU_AGENT); ledgers nobody uses any
    /// more are dropped. Raise it where one container or pod runs GPU work in many
    /// cgroups of its own.
    #[arg(long, value_name = "N", default_value_t = ledgers::DEFAULT_MAX_PER_TENANT as u32,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_ledgers_per_tenant: u32,

    /// Where limits are kept across restarts.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/fgpu")]
    state_dir: PathBuf,

    /// bpffs directory for the kernel state that outlives the agent (pinned maps and probe
    /// links); a restarted agent takes over from it. Remove it, with the agent stopped, to
    /// take fgpu's probes out of the kernel.
    #[arg(long, value_name = "DIR", default_value = "/sys/fs/bpf/fgpu")]
    bpf_dir: PathBuf,

    /// Besides root, members of this group may use the admin socket (status, limits).
    #[arg(long, value_name = "GROUP")]
    socket_group: Option<String>,

    /// A driver library to probe besides the ones found on the host (repeatable), e.g. a
    /// container's forward-compatibility copy of libcuda.so.1.
    #[arg(long = "libcuda", value_name = "PATH")]
    libcuda: Vec<PathBuf>,

    /// Use the simulated driver (fgpu-sim) instead of the host's: probes DIR/libcuda.so.1,
    /// where DIR is $FGPU_SIM_DIR or `target/sim` beside this binary. For trying fgpu and
    /// for tests on machines without a GPU.
    #[arg(long)]
    sim: bool,

    /// The NVIDIA driver's root (the host's `/` mounted into the agent's container, or the
    /// root a driver container installs to): libnvidia-ml.so.1 is loaded from its library
    /// directories [default: the system's loader path].
    #[arg(long, value_name = "DIR")]
    driver_root: Option<PathBuf>,

    /// What the kernel does when an allocation takes a cgroup past its memory limit (one
    /// that bypassed the shim): kill the process at that allocation, or only report it.
    #[arg(long, value_enum, default_value = "kill")]
    on_exceed: limits::OnExceed,

    /// How far past its limit on a GPU a limited cgroup's memory may go, as the driver counts
    /// it (NVML's per-process figures: contexts, modules, local memory grown by launches,
    /// device heaps, arrays — memory no allocation call shows), before the agent treats it as
    /// an overrun: reported at once and, with `--on-exceed kill`, the process holding the
    /// most such memory is killed if the cgroup is still over a second later. The room covers
    /// contexts and lazily loaded modules; `0` holds the driver's figure to the limit itself.
    #[arg(long, value_name = "SIZE", default_value = unseen::DEFAULT_TOLERANCE,
          value_parser = |s: &str| fgpu_common::quantity::parse_size(s).map_err(|e| e.to_string()))]
    unseen_tolerance: u64,

    /// Host memory parked containers' device memory may take, all together
    /// (`fgpu limit set --park-after`, docs/parking.md): a container whose memory would not
    /// fit is not parked. The copies are pinned host memory of the parked processes, charged
    /// to their own memory cgroups. Default: half of the node's memory.
    #[arg(long, value_name = "SIZE",
          value_parser = |s: &str| fgpu_common::quantity::parse_size(s).map_err(|e| e.to_string()))]
    park_host_memory: Option<u64>,

    /// Log filter (tracing's EnvFilter syntax), e.g. `info`, `debug`, `fgpu=debug`.
    #[arg(long, value_name = "FILTER", default_value = "info", env = "FGPU_LOG")]
    log: String,

    /// When the agent runs in a container (privileged, --pid=host, --cgroupns=host): a process
    /// on the host, e.g. 1. The admin socket then serves callers in its PID, mount and user
    /// namespaces (the host's fgpu, the CDI hook) instead of the agent's own; the agent first
    /// checks that it shares the host's PID, cgroup and user namespaces and says which
    /// container option is missing if not. docs/containers.md.
    #[arg(long, value_name = "PID")]
    host_process: Option<u32>,
    /// In a Kubernetes pod (the Helm chart's DaemonSet): the admin socket also serves the
    /// other containers of the agent's own pod — the kubelet plugin, `kubectl exec -c agent
    /// -- fgpu ...` — which share the host's PID and user namespaces (`hostPID`) but have
    /// mount namespaces of their own. Told apart by the cgroup the kernel reports for the
    /// caller (a container directly in the agent's pod cgroup); the agent refuses to start if
    /// its own cgroup is not a pod's container. Needs --host-process.
    #[arg(long, requires = "host_process")]
    admin_own_pod: bool,
    /// Log line format: `text` (key=value fields) or `json` (one object per line, for log
    /// pipelines; limit changes, denials and backstop actions carry an `event` field).
    #[arg(
        long,
        value_enum,
        value_name = "FORMAT",
        default_value = "text",
        env = "FGPU_LOG_FORMAT"
    )]
    log_format: logging::LogFormat,

    /// Serve metrics (OpenMetrics, for Prometheus) on http://ADDR/metrics, with /healthz and
    /// /readyz for liveness and readiness probes; e.g. 127.0.0.1:9400. Whoever reaches ADDR
    /// reads every tenant's figures: 0.0.0.0:9400 is every peer that can route to the node
    /// (port 0 picks a free port; the log says which). Off by default.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
}

pub fn run(args: AgentArgs) -> Result<()> {
    logging::init(&args.log, args.log_format)?;
    // First, so that /readyz says "not ready" while the probes are being attached.
    let metrics = args.metrics.map(metrics::Metrics::start).transpose()?;
    server::check_paths(&args.admin_socket, &args.socket)?;
    match args.host_process {
        Some(pid) => hostns::adopt(pid)?,
        None => hostns::warn_if_in_container(),
    }
    if args.admin_own_pod {
        let own = pidfd::cgroup_of_pid(std::process::id())
            .context("--admin-own-pod: cannot read the agent's own cgroup")?;
        ownpod::adopt(&own)?;
    }
    let host = preflight::check()?;
    let limits = limits::LimitStore::open(&args.state_dir)?;
    let bound = bound::Bound::open(&args.state_dir)?;
    let access = peer::Access {
        group_gid: args.socket_group.as_deref().map(group_id).transpose()?,
        group_name: args.socket_group.clone(),
    };
    let nvml_lib = match (&args.driver_root, args.sim) {
        (_, true) => Some(sim_dir()?.join("libnvidia-ml.so.1")),
        (Some(root), false) => match crate::driverroot::nvml_under(root) {
            Ok(p) => Some(p),
            Err(err) => {
                tracing::warn!("{err:#}: GPUs are not listed by NVML");
                None
            }
        },
        (None, false) => None,
    };
    let gpus = gpus::Gpus::open(nvml_lib.as_deref());
    let mut probes = probes::Probes::load(&args.bpf_dir)?;
    let mut kernel = kernel::KernelMaps::take(&mut probes.ebpf)?;
    // Before any probe on a driver library is attached, so that no allocation is counted
    // against a shared parent taken for a tenant.
    let marked = shared::mark_below(&mut kernel, &host.cgroup2_mount, "/");
    tracing::info!(marked, "shared parent cgroups marked in the kernel");
    let ring = events::ring(&mut probes.ebpf)?;

    let libraries = Arc::new(Mutex::new(Vec::new()));
    let mut watcher = Watcher::new(probes, Arc::clone(&libraries));
    for (path, driver) in watcher::explicit(&args.libcuda)? {
        watcher.consider(&path, driver)?;
    }
    if args.sim {
        let sim = sim_dir()?;
        watcher.consider(&sim.join(LIBCUDA), Driver::Cuda)?;
        // The simulated HIP runtime too, where it is installed (a CUDA-only sim has none).
        if let Some(hip) = ["libamdhip64.so.7", "libamdhip64.so"]
            .iter()
            .map(|n| sim.join(n))
            .find(|p| p.exists())
            && let Err(err) = watcher.consider(&hip, Driver::Hip)
        {
            tracing::warn!("not probing {}: {err:#}", hip.display());
        }
    } else {
        for (path, driver) in discovery::system_candidates() {
            if let Err(err) = watcher.consider(&path, driver) {
                tracing::warn!("not probing {}: {err:#}", path.display());
            }
        }
    }
    watcher.scan_all();
    watcher.retire_previous();
    if watcher.attached() == 0 {
        bail!(
            "no GPU driver library found (libcuda.so.1 or libamdhip64.so; looked in the \
             ldconfig cache, /usr/local/nvidia/lib64, the distribution's library directories \
             and running processes): is the driver installed? Point at one with --libcuda \
             PATH, or on a machine without a GPU try the simulated driver: `cargo xtask run --sim`"
        );
    }
    if let Some(m) = &metrics {
        m.probes_attached();
    }
    let (exec_tx, exec_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("fgpu-watcher".into())
        .spawn(move || watcher.run(exec_rx))
        .context("starting the library watcher")?;

    let state = Arc::new(state::State::new(state::Parts {
        cgroup2_mount: host.cgroup2_mount.clone(),
        kernel,
        limits,
        bound,
        gpus,
        access,
        libraries,
        on_exceed: args.on_exceed,
        unseen_tolerance: args.unseen_tolerance,
        max_ledgers_per_tenant: args.max_ledgers_per_tenant as usize,
    }));
    if let Some(m) = &metrics {
        m.set_state(&state);
    }
    {
        let state = Arc::clone(&state);
        std::thread::Builder::new()
            .name("fgpu-compute".into())
            .spawn(move || compute::run(state.ledgers(), state.compute(), state.gpus()))
            .context("starting the compute controller")?;
    }
    {
        let state = Arc::clone(&state);
        let budget = args
            .park_host_memory
            .unwrap_or_else(park::default_host_budget);
        std::thread::Builder::new()
            .name("fgpu-park".into())
            .spawn(move || {
                let tree = || state.tree_by_gpu();
                park::run(state.ledgers(), state.park(), state.gpus(), budget, &tree)
            })
            .context("starting the parking broker")?;
    }

    {
        // The budget pass, dead slots' reclaim and unused ledgers' drop run on a thread of
        // their own: however long a pass takes, the sockets and the kernel's events are
        // served on theirs.
        let state = Arc::clone(&state);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .context("starting the budget thread's runtime")?;
        std::thread::Builder::new()
            .name("fgpu-budget".into())
            .spawn(move || runtime.block_on(publisher::run(state)))
            .context("starting the budget thread")?;
    }

    // The kernel enforces from here on, also over maps a previous agent pinned.
    let written = enforce::sync(&state);
    tracing::info!(written, "kernel limits in sync with the limit store");

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let fd_limit = doors::raise_fd_limit();
    let result = runtime.block_on(async {
        let containers = server::bind_containers(&args.socket)?;
        let admin = server::bind_admin(&args.admin_socket, &args.socket, state.access().group_gid)?;
        tracing::info!(
            socket = %args.socket.display(),
            admin_socket = %args.admin_socket.display(),
            fd_limit,
            cgroup2 = %host.cgroup2_mount.display(),
            libraries = ?state.libraries(),
            "fgpu agent ready"
        );
        // The enforce loop owns its enforcer; the event thread tells it of execs and removed
        // cgroups through the channel's other end.
        let (enforcer, notices) = enforcer::channel();
        let outlets = events::Outlets {
            watcher: exec_tx,
            enforcer: notices,
        };
        let events_task = tokio::spawn(events::drain(ring, Arc::clone(&state), outlets));
        let eventlog_task = tokio::spawn(metrics::eventlog::run(Arc::clone(&state)));
        if let Some(m) = &metrics {
            tokio::spawn(m.clone().beat());
            m.sockets_served();
        }
        let containers_limits = doors::Limits::containers(
            args.max_connections as usize,
            args.max_connections_per_cgroup as usize,
        );
        let serve_containers = server::serve(
            containers,
            doors::Door::Containers,
            containers_limits,
            Arc::clone(&state),
        );
        let serve_admin = server::serve(
            admin,
            doors::Door::Admin,
            doors::Limits::admin(),
            Arc::clone(&state),
        );
        let enforce_task = tokio::spawn(enforce::run(Arc::clone(&state), enforcer));
        let bound_task = tokio::spawn(apply::run_bound(Arc::clone(&state)));
        let served = tokio::select! {
            () = serve_containers => Ok(()),
            () = serve_admin => Ok(()),
            r = shutdown_signal() => r,
        };
        events_task.abort();
        eventlog_task.abort();
        enforce_task.abort();
        bound_task.abort();
        served
    });
    let _ = std::fs::remove_file(&args.socket);
    let _ = std::fs::remove_file(&args.admin_socket);
    tracing::info!(
        bpf_dir = %args.bpf_dir.display(),
        "fgpu agent stopped; the probes stay attached (pinned) until the next agent takes over"
    );
    result
}

async fn shutdown_signal() -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    tracing::info!("shutting down");
    Ok(())
}

/// Where the simulated driver's libraries are: `$FGPU_SIM_DIR`, else `../sim` relative to
/// this binary (`target/release/fgpu` → `target/sim`).
pub(crate) fn sim_dir() -> Result<PathBuf> {
    let dir = match std::env::var_os("FGPU_SIM_DIR") {
        Some(d) => PathBuf::from(d),
        None => std::env::current_exe()?
            .parent()
            .and_then(|p| p.parent())
            .map(|p| p.join("sim"))
            .context("cannot locate target/sim from this binary's path")?,
    };
    if !dir.join(LIBCUDA).is_file() {
        bail!(
            "--sim: the simulated driver is not built ({} is missing): run `cargo xtask build` \
             or set FGPU_SIM_DIR to the folder holding libcuda.so.1 from fgpu-sim",
            dir.join(LIBCUDA).display()
        );
    }
    Ok(dir)
}

/// The gid of a group name, from /etc/group.
fn group_id(name: &str) -> Result<u32> {
    let groups = std::fs::read_to_string("/etc/group").context("reading /etc/group")?;
    groups
        .lines()
        .find_map(|l| {
            let mut f = l.split(':');
            (f.next() == Some(name)).then(|| f.nth(1)?.parse().ok())?
        })
        .with_context(|| format!("--socket-group {name}: no such group in /etc/group"))
}
