//! `fgpu kubelet-plugin`: fgpu's Kubernetes DRA driver on a node (docs/kubernetes.md). It
//! registers with the kubelet's plugin watcher, serves the DRA gRPC API (v1), publishes the
//! node's ResourceSlice, and turns each prepared ResourceClaim's consumed capacities into
//! limits on its pod's cgroup, held by the agent (`fgpu agent`) through its admin socket.

mod checkpoint;
mod claim;
pub(crate) mod deviceplugin;
mod driver;
mod opaque;
mod podcgroup;
mod quantity;
mod server;
mod slice;
pub mod target;
mod v1beta1;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::cdi::spec;

#[derive(Debug, Args)]
pub struct KubeletPluginArgs {
    /// The DRA driver name (ResourceSlices, DeviceClass selectors, CDI vendor).
    #[arg(long, default_value = "fgpu.io")]
    pub driver_name: String,
    /// This node's name: publish its ResourceSlice (in a DaemonSet: from spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// The kubelet's plugin-watcher directory: the registration socket goes here.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/kubelet/plugins_registry"
    )]
    pub registry_dir: PathBuf,
    /// The kubelet's plugins directory: the DRA socket is DIR/<driver>/dra.sock.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/kubelet/plugins")]
    pub plugins_dir: PathBuf,
    /// Where the claims' CDI specs are written (a directory the container runtime reads).
    #[arg(long, value_name = "DIR", default_value = "/var/run/cdi")]
    pub cdi_dir: PathBuf,
    /// The checkpoint of prepared claims lives here (on the host: survives upgrades).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/fgpu")]
    pub state_dir: PathBuf,
    /// The agent's admin socket [default: $FGPU_ADMIN_SOCKET, else /run/fgpu-admin/fgpu.sock].
    #[arg(long, value_name = "PATH")]
    pub admin_socket: Option<PathBuf>,
    /// The agent's containers' socket on the host, mounted into pods [default: $FGPU_SOCKET,
    /// else /run/fgpu/fgpu.sock].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// libfgpu.so on the host [default: beside this binary, else /usr/lib/fgpu/libfgpu.so].
    #[arg(long, value_name = "PATH")]
    pub shim: Option<PathBuf>,
    /// The cgroup (relative to the cgroup v2 root) under which the kubelet makes kubepods.
    #[arg(long, value_name = "CGROUP", default_value = "/")]
    pub cgroup_parent: String,
    /// The API server's URL, without authentication (tests, `kubectl proxy`) [default: the
    /// in-cluster service account, else $KUBECONFIG / ~/.kube/config].
    #[arg(long, value_name = "URL")]
    pub api_server: Option<String>,
    /// How often the node's ResourceSlice is read back and published again when it is gone
    /// (a kubelet that starts deletes its node's slices; so does one 30 s after a plugin
    /// went away). A failed publish is retried sooner: 1 s, 2 s, ... up to this.
    #[arg(long, value_name = "SECONDS", default_value_t = 15,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub slice_recheck: u64,
    /// How often each prepared claim's `status.reservedFor` is read again: a pod that starts
    /// sharing a claim already prepared on this node gets no prepare call (the kubelet
    /// prepares a claim once per node), so its limit is set when it is seen here.
    #[arg(long, value_name = "SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub claim_recheck: u64,
    /// The NVIDIA driver's root (the host's `/` mounted into the plugin's container):
    /// libnvidia-ml.so.1 is loaded from its library directories [default: the system's].
    #[arg(long, value_name = "DIR")]
    pub driver_root: Option<PathBuf>,
    /// List the simulated driver's GPUs ($FGPU_SIM_DIR/libnvidia-ml.so.1).
    #[arg(long)]
    pub sim: bool,
    /// Serve the device-plugin fallback instead of DRA: extended resources
    /// <driver>/gpu-memory (units of --memory-unit) and <driver>/gpu-compute (percent), for
    /// clusters without DRA consumable capacity. Needs fgpu's node CDI spec (`fgpu cdi
    /// generate`) in a CDI directory.
    #[arg(long)]
    pub device_plugin: bool,
    /// The kubelet's device-plugins directory (kubelet.sock and the plugins' sockets).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/kubelet/device-plugins"
    )]
    pub device_plugins_dir: PathBuf,
    /// The size of one <driver>/gpu-memory unit.
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = size)]
    pub memory_unit: u64,
    /// The CDI kind of fgpu's node spec, whose devices KIND=UUID the device plugin hands out.
    #[arg(long, default_value = spec::DEFAULT_KIND)]
    pub cdi_kind: String,
    /// Log filter (error, warn, info, debug, or a tracing filter).
    #[arg(long, default_value = "info")]
    pub log: String,
}

fn size(s: &str) -> Result<u64, String> {
    match fgpu_common::quantity::parse_size(s) {
        Ok(0) => Err("a unit of 0 bytes".into()),
        Ok(b) => Ok(b),
        Err(e) => Err(e.to_string()),
    }
}

pub fn run(args: &KubeletPluginArgs) -> Result<()> {
    crate::agent::logging::init(&args.log, crate::agent::logging::LogFormat::Text)?;
    spec::check_kind(&format!("{}/claim", args.driver_name))
        .map_err(|e| anyhow::anyhow!("--driver-name {}: {e}", args.driver_name))?;
    // One TLS provider for the API server's connection, whatever else links rustls.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // A call to the agent that waits (a busy or hung agent) must not stall the gRPC servers,
    // the registration handshake or the slice's upkeep: those calls run on the blocking pool
    // (driver.rs, `ask`), as two workers alone did not keep them from stalling the runtime.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(serve(args))
}

fn abs(p: &Path) -> Result<String> {
    let p = std::path::absolute(p)?;
    p.to_str()
        .map(str::to_string)
        .context("a path that is not UTF-8")
}

async fn serve(args: &KubeletPluginArgs) -> Result<()> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let cgroup_mount = fgpu_common::cgroup::cgroup2_mount(&mountinfo)
        .context("no cgroup v2 hierarchy is mounted")?;
    let exe = std::env::current_exe()?;
    let shim = args.shim.clone().unwrap_or_else(|| {
        let beside = exe.with_file_name("libfgpu.so");
        if beside.is_file() {
            beside
        } else {
            PathBuf::from("/usr/lib/fgpu/libfgpu.so")
        }
    });
    let socket = args.socket.clone().unwrap_or_else(crate::containers_socket);
    let admin_socket = args.admin_socket.clone().unwrap_or_else(|| {
        std::env::var_os("FGPU_ADMIN_SOCKET")
            .map_or_else(|| PathBuf::from(crate::DEFAULT_ADMIN_SOCKET), PathBuf::from)
    });
    let gpus = list_gpus(args.sim, args.driver_root.as_deref())?;
    if gpus.is_empty() {
        tracing::warn!("no GPUs found: nothing to offer");
    }
    if args.device_plugin {
        return serve_device_plugins(args, &gpus).await;
    }
    let client = match &args.api_server {
        Some(url) => {
            let uri: http::Uri = url.parse().with_context(|| format!("--api-server {url}"))?;
            Some(kube::Client::try_from(config_for(uri))?)
        }
        None => match kube::Client::try_default().await {
            Ok(c) => Some(c),
            Err(err) => {
                tracing::warn!("no API server ({err}): claims cannot be prepared");
                None
            }
        },
    };
    let cfg = driver::Config {
        driver: args.driver_name.clone(),
        admin_socket,
        cgroup_mount,
        cgroup_parent: args.cgroup_parent.clone(),
        cdi_dir: args.cdi_dir.clone(),
        spec_inputs: spec::Inputs {
            kind: String::new(),
            gpus: Vec::new(),
            shim: abs(&shim)?,
            socket: abs(&socket)?,
            preload: spec::Preload::Env,
            fgpu: abs(&exe)?,
            hook_args: Vec::new(),
            nvidia: None,
        },
        gpus: gpus
            .iter()
            .map(|g| {
                (
                    slice::device_name(g.index),
                    spec::Gpu {
                        index: g.index,
                        uuid: g.uuid.clone(),
                        minor: g.index,
                    },
                )
            })
            .collect::<BTreeMap<_, _>>(),
        memory: gpus
            .iter()
            .map(|g| (slice::device_name(g.index), g.memory_bytes))
            .collect(),
    };
    let ckpt_path = args
        .state_dir
        .join(format!("kubelet-plugin-{}.json", args.driver_name));
    let ckpt = checkpoint::Checkpoint::load(&ckpt_path)?;
    tracing::info!(claims = ckpt.claims.len(), checkpoint = %ckpt_path.display(), "checkpoint read");
    let driver = Arc::new(driver::Driver::new(cfg, client.clone(), ckpt));
    driver.reconcile(true).await;

    let slices = match (&args.node_name, &client) {
        (Some(node), Some(client)) => Some(tokio::spawn(slice::keep_published(
            client.clone(),
            node.clone(),
            args.driver_name.clone(),
            gpus.clone(),
            Duration::from_secs(args.slice_recheck),
        ))),
        (None, _) => {
            tracing::warn!("no --node-name (NODE_NAME): the ResourceSlice is not published");
            None
        }
        (Some(_), None) => None,
    };

    let dra_sock = args.plugins_dir.join(&args.driver_name).join("dra.sock");
    let reg_sock = args
        .registry_dir
        .join(format!("{}-reg.sock", args.driver_name));
    if dra_sock.as_os_str().len() > 107 || reg_sock.as_os_str().len() > 107 {
        bail!(
            "socket paths longer than 107 bytes cannot be bound: {}",
            dra_sock.display()
        );
    }
    let dra_incoming = server::bind(&dra_sock)?;
    let reg_incoming = server::bind(&reg_sock)?;
    let dra = tonic::transport::Server::builder()
        .add_service(
            fgpu_kubelet_api::dra::v1::dra_plugin_server::DraPluginServer::new(server::DraService(
                driver.clone(),
            )),
        )
        .add_service(
            fgpu_kubelet_api::dra::v1beta1::dra_plugin_server::DraPluginServer::new(
                server::DraService(driver.clone()),
            ),
        )
        .serve_with_incoming(dra_incoming);
    let reg = tonic::transport::Server::builder()
        .add_service(
            fgpu_kubelet_api::pluginregistration::registration_server::RegistrationServer::new(
                server::RegistrationService {
                    driver: args.driver_name.clone(),
                    endpoint: abs(&dra_sock)?,
                },
            ),
        )
        .serve_with_incoming(reg_incoming);
    let d = driver.clone();
    let claim_recheck = Duration::from_secs(args.claim_recheck);
    // The reconciler runs on this thread, which also accepts both servers' connections:
    // nothing in it may block (its calls to the agent are on the blocking pool).
    let reconciler = async move {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        let mut n: u64 = 0;
        let mut sharers_read = tokio::time::Instant::now();
        loop {
            tick.tick().await;
            n += 1;
            if sharers_read.elapsed() >= claim_recheck {
                d.refresh_sharers().await;
                sharers_read = tokio::time::Instant::now();
            }
            d.reconcile(n.is_multiple_of(50)).await;
        }
    };
    tracing::info!(driver = %args.driver_name, dra = %dra_sock.display(), registration = %reg_sock.display(), "kubelet plugin serving");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let result = tokio::select! {
        r = dra => r.context("the DRA service"),
        r = reg => r.context("the registration service"),
        () = reconciler => Ok(()),
        _ = term.recv() => Ok(()),
        _ = tokio::signal::ctrl_c() => Ok(()),
    };
    if let Some(s) = slices {
        s.abort();
    }
    // Gone sockets tell the kubelet we are gone (it re-registers us when they come back).
    let _ = std::fs::remove_file(&reg_sock);
    let _ = std::fs::remove_file(&dra_sock);
    result
}

async fn serve_device_plugins(args: &KubeletPluginArgs, gpus: &[slice::SliceGpu]) -> Result<()> {
    use fgpu_kubelet_api::deviceplugin::v1beta1::device_plugin_server::DevicePluginServer;
    spec::check_kind(&args.cdi_kind).map_err(anyhow::Error::msg)?;
    let resources = [
        (
            format!("{}/gpu-memory", args.driver_name),
            deviceplugin::Unit::Memory(args.memory_unit),
        ),
        (
            format!("{}/gpu-compute", args.driver_name),
            deviceplugin::Unit::Compute,
        ),
    ];
    let plugins: Vec<deviceplugin::Resource> = resources
        .into_iter()
        .map(|(name, unit)| deviceplugin::Resource {
            name,
            unit,
            gpus: gpus
                .iter()
                .map(|g| {
                    let n = match unit {
                        deviceplugin::Unit::Memory(b) => g.memory_bytes / b,
                        deviceplugin::Unit::Compute => 100,
                    };
                    (g.index, g.uuid.clone(), n)
                })
                .collect(),
            cdi_kind: args.cdi_kind.clone(),
        })
        .collect();
    let ino = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
    };
    // One server per resource on a socket of its own. A kubelet that starts deletes every
    // socket in its device-plugins directory (pkg/kubelet/cm/devicemanager/manager.go,
    // `Start` → `removeContents`) and then takes registrations on its new kubelet.sock: a
    // plugin must serve on a new socket before it registers again (as NVIDIA's
    // k8s-device-plugin restarts its servers when kubelet.sock is made anew).
    let bind_all = || -> Result<Vec<Serving>> {
        let mut servers = Vec::new();
        for r in &plugins {
            let sock = args
                .device_plugins_dir
                .join(deviceplugin::socket_name(&r.name));
            let incoming = server::bind(&sock)?;
            tracing::info!(resource = %r.name, devices = r.device_ids().len(), socket = %sock.display(), "device plugin serving");
            let task = tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(DevicePluginServer::new(deviceplugin::DevicePluginService(
                        r.clone(),
                    )))
                    .serve_with_incoming(incoming),
            );
            servers.push(Serving {
                ino: ino(&sock),
                sock,
                task,
            });
        }
        Ok(servers)
    };
    let mut servers = bind_all()?;
    let kubelet = args.device_plugins_dir.join("kubelet.sock");
    let mut registered: Option<u64> = None;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
        if servers
            .iter()
            .any(|s| s.ino.is_none() || ino(&s.sock) != s.ino)
        {
            tracing::warn!(
                "a device-plugin socket is gone (a kubelet that starts deletes them): \
                 serving on new sockets and registering again"
            );
            for s in &servers {
                s.task.abort();
            }
            servers = bind_all()?;
            registered = None;
        }
        let now = ino(&kubelet);
        if now.is_some() && now != registered {
            let mut ok = true;
            for r in &plugins {
                if let Err(err) = deviceplugin::register(&args.device_plugins_dir, &r.name).await {
                    tracing::warn!("{err:#}");
                    ok = false;
                }
            }
            if ok {
                registered = now;
            }
        }
        if servers.iter().any(|s| s.task.is_finished()) {
            bail!("a device-plugin server stopped");
        }
    }
    for s in &servers {
        let _ = std::fs::remove_file(&s.sock);
    }
    Ok(())
}

/// One device-plugin server and the socket it serves on (its inode when bound: a socket
/// deleted, or deleted and made again by someone else, is not ours any more).
struct Serving {
    sock: PathBuf,
    ino: Option<u64>,
    task: tokio::task::JoinHandle<std::result::Result<(), tonic::transport::Error>>,
}

/// The node's GPUs by NVML (the simulated driver's with `sim`). None found: an empty list.
fn list_gpus(sim: bool, driver_root: Option<&Path>) -> Result<Vec<slice::SliceGpu>> {
    let mut builder = nvml_wrapper::Nvml::builder();
    let lib = if sim {
        Some(
            std::env::var_os("FGPU_SIM_DIR")
                .map(PathBuf::from)
                .context("--sim needs FGPU_SIM_DIR (the folder of the simulated driver)")?
                .join("libnvidia-ml.so.1"),
        )
    } else if let Some(root) = driver_root {
        match crate::driverroot::nvml_under(root) {
            Ok(p) => Some(p),
            Err(err) => {
                tracing::warn!("{err:#}: no GPUs to offer");
                return Ok(Vec::new());
            }
        }
    } else {
        None
    };
    if let Some(lib) = &lib {
        builder.lib_path(lib.as_os_str());
    }
    let nvml = match builder.init() {
        Ok(n) => n,
        Err(err) => {
            tracing::warn!("NVML unavailable ({err})");
            return Ok(Vec::new());
        }
    };
    let driver_version = nvml.sys_driver_version().unwrap_or_default();
    let mut gpus = Vec::new();
    for index in 0..nvml.device_count()? {
        let d = nvml.device_by_index(index)?;
        gpus.push(slice::SliceGpu {
            index,
            uuid: d.uuid()?,
            product: d.name().unwrap_or_default(),
            driver_version: driver_version.clone(),
            memory_bytes: d.memory_info()?.total,
        });
    }
    Ok(gpus)
}

/// A client configuration for an API server given by URL, without authentication (tests,
/// `kubectl proxy`). Over plain `http` no trust store is needed: without this, the client
/// would look for the system's CA certificates anyway and fail where the image has none
/// (the chart's image, ubuntu without ca-certificates: found by running the DaemonSet in
/// real containers, tests/e2e_kubernetes_daemonset.rs). In-cluster, the service account's
/// CA is used (kube::Config::infer).
pub(crate) fn config_for(uri: http::Uri) -> kube::Config {
    let plain = uri.scheme_str() == Some("http");
    let mut c = kube::Config::new(uri);
    if plain {
        c.root_cert = Some(Vec::new());
    }
    c
}
