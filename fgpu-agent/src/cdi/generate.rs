//! `fgpu cdi generate`: finds the node's GPUs (NVML) and fgpu's files, and writes the spec.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use fgpu_common::quantity::{Size, parse_size};

use super::spec::{self, Gpu, Inputs, Nvidia, Preload};

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Write the spec here (atomically) instead of to stdout, e.g. /etc/cdi/fgpu.json or
    /// /var/run/cdi/fgpu.json (the directories runtimes read).
    #[arg(long, short, value_name = "PATH")]
    output: Option<PathBuf>,
    /// The CDI kind, VENDOR/CLASS: containers ask for `--device KIND=0`.
    #[arg(long, default_value = spec::DEFAULT_KIND)]
    kind: String,
    /// libfgpu.so on the host [default: beside this fgpu binary, else /usr/lib/fgpu/libfgpu.so].
    #[arg(long, value_name = "PATH")]
    shim: Option<PathBuf>,
    /// The agent's containers' socket on the host: its directory (and only it) is mounted at
    /// /run/fgpu in containers [default: $FGPU_SOCKET, else /run/fgpu/fgpu.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// The agent's admin socket, for the hook (which runs on the host, never in the container)
    /// [default: $FGPU_ADMIN_SOCKET, else /run/fgpu-admin/fgpu.sock].
    #[arg(long, value_name = "PATH")]
    admin_socket: Option<PathBuf>,
    /// The fgpu binary the runtime runs as the hook [default: this binary].
    #[arg(long, value_name = "PATH")]
    fgpu: Option<PathBuf>,
    /// Mount this host file (written with the shim's path) at /etc/ld.so.preload instead of
    /// setting LD_PRELOAD: the shim then also loads into processes started with a cleared
    /// environment. It replaces an image's own /etc/ld.so.preload.
    #[arg(long, value_name = "PATH")]
    ld_so_preload: Option<PathBuf>,
    /// Also inject the NVIDIA device nodes (/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidiaN) and
    /// driver libraries (libcuda, libnvidia-ml, nvidia-smi under /usr/local/nvidia). Leave it
    /// off when NVIDIA's own CDI spec (`nvidia-ctk cdi generate`) or `--gpus` already does:
    /// then ask for both devices, e.g. `--device nvidia.com/gpu=0 --device fgpu.io/gpu=0`.
    #[arg(long)]
    nvidia: bool,
    /// The hook's memory limit for containers that ask for none, e.g. 8GiB.
    #[arg(long, value_name = "SIZE", value_parser = size)]
    default_memory: Option<u64>,
    /// The hook refuses containers asking for more memory than this.
    #[arg(long, value_name = "SIZE", value_parser = size)]
    max_memory: Option<u64>,
    /// The hook refuses containers asking for a larger compute share than this percent.
    #[arg(long, value_name = "PERCENT", value_parser = clap::value_parser!(u8).range(1..=100))]
    max_compute: Option<u8>,
    /// The hook starts a container even when the agent cannot be reached (its shim then
    /// enforces the environment's limit alone) instead of refusing it.
    #[arg(long)]
    allow_without_agent: bool,
    /// libnvidia-ml.so.1 to list GPUs with [default: the system's; with --sim the simulated one].
    #[arg(long, value_name = "PATH")]
    nvml: Option<PathBuf>,
    /// The driver's root (a host's `/` mounted into a container): libnvidia-ml.so.1 is looked
    /// for in its library directories (crate::driverroot).
    #[arg(long, value_name = "DIR", conflicts_with = "nvml")]
    driver_root: Option<PathBuf>,
    /// List the simulated driver's GPUs ($FGPU_SIM_DIR/libnvidia-ml.so.1).
    #[arg(long)]
    sim: bool,
}

fn size(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

pub fn run(args: &GenerateArgs) -> Result<()> {
    spec::check_kind(&args.kind).map_err(anyhow::Error::msg)?;
    let exe = std::env::current_exe().context("locating this fgpu binary")?;
    let shim = match &args.shim {
        Some(p) => p.clone(),
        None => [
            exe.with_file_name("libfgpu.so"),
            PathBuf::from("/usr/lib/fgpu/libfgpu.so"),
        ]
        .into_iter()
        .find(|p| p.is_file())
        .context(
            "libfgpu.so not found beside this binary nor in /usr/lib/fgpu: give --shim PATH",
        )?,
    };
    if !shim.is_file() {
        bail!("--shim {}: no such file", shim.display());
    }
    let socket = args.socket.clone().unwrap_or_else(crate::containers_socket);
    let admin = args.admin_socket.clone().unwrap_or_else(|| {
        std::env::var_os("FGPU_ADMIN_SOCKET")
            .map_or_else(|| PathBuf::from(crate::DEFAULT_ADMIN_SOCKET), PathBuf::from)
    });
    if socket.parent() == admin.parent() {
        bail!(
            "the containers' socket {} and the admin socket {} are in one directory: \
             containers would be given the admin socket",
            socket.display(),
            admin.display()
        );
    }
    let fgpu = args.fgpu.clone().unwrap_or(exe);
    let mut hook_args = vec!["--admin-socket".to_string(), abs(&admin)?];
    if let Some(m) = args.default_memory {
        hook_args.extend(["--default-memory".into(), m.to_string()]);
    }
    if let Some(m) = args.max_memory {
        hook_args.extend(["--max-memory".into(), m.to_string()]);
    }
    if let Some(c) = args.max_compute {
        hook_args.extend(["--max-compute".into(), c.to_string()]);
    }
    if args.allow_without_agent {
        hook_args.push("--allow-without-agent".into());
    }
    let preload = match &args.ld_so_preload {
        None => Preload::Env,
        Some(file) => {
            write_file(file, format!("{}\n", spec::SHIM_IN_CONTAINER).as_bytes())?;
            Preload::File(abs(file)?)
        }
    };
    let gpus = list_gpus(args)?;
    let nvidia = args.nvidia.then(|| nvidia_parts(&gpus));
    let spec = spec::build(&Inputs {
        kind: args.kind.clone(),
        gpus,
        shim: abs(&shim)?,
        socket: abs(&socket)?,
        preload,
        fgpu: abs(&fgpu)?,
        hook_args,
        nvidia,
    });
    let mut json = serde_json::to_vec_pretty(&spec)?;
    json.push(b'\n');
    match &args.output {
        None => std::io::stdout().write_all(&json)?,
        Some(path) => {
            write_file(path, &json)?;
            eprintln!(
                "wrote {} ({} devices: {}=all, by index and by UUID)",
                path.display(),
                spec.devices.len(),
                args.kind
            );
        }
    }
    Ok(())
}

fn abs(p: &Path) -> Result<String> {
    let p = std::path::absolute(p).with_context(|| format!("{}", p.display()))?;
    p.to_str()
        .map(str::to_string)
        .with_context(|| format!("{}: not UTF-8", p.display()))
}

/// Writes `bytes` to `path` atomically (a temporary file renamed over it), mode 0644.
pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let name = path.file_name().context("--output needs a file name")?;
    let tmp = path.with_file_name(format!(".{}.tmp", name.to_string_lossy()));
    crate::statefile::write_atomic(path, &tmp, bytes, 0o644)
        .with_context(|| format!("writing {}", path.display()))
}

fn list_gpus(args: &GenerateArgs) -> Result<Vec<Gpu>> {
    let lib = match (&args.nvml, args.sim) {
        (Some(p), _) => Some(p.clone()),
        (None, false) if args.driver_root.is_some() => {
            let root = args.driver_root.as_deref().expect("given");
            match crate::driverroot::nvml_under(root) {
                Ok(p) => Some(p),
                Err(err) => {
                    eprintln!("fgpu: warning: {err:#}");
                    None
                }
            }
        }
        (None, true) => Some(
            std::env::var_os("FGPU_SIM_DIR")
                .map(PathBuf::from)
                .context("--sim needs FGPU_SIM_DIR (the folder of the simulated driver)")?
                .join("libnvidia-ml.so.1"),
        ),
        (None, false) => None,
    };
    let mut builder = nvml_wrapper::Nvml::builder();
    if let Some(lib) = &lib {
        builder.lib_path(lib.as_os_str());
    }
    let nvml = match builder.init() {
        Ok(n) => n,
        Err(err) => {
            eprintln!(
                "fgpu: warning: NVML unavailable ({err}): the spec has only the device `all`"
            );
            return Ok(Vec::new());
        }
    };
    let count = nvml.device_count().context("NVML: counting devices")?;
    let mut gpus = Vec::new();
    for index in 0..count {
        let d = nvml
            .device_by_index(index)
            .with_context(|| format!("NVML: device {index}"))?;
        let uuid = d
            .uuid()
            .with_context(|| format!("NVML: UUID of device {index}"))?;
        let minor = d.minor_number().unwrap_or(index);
        let memory = d.memory_info().map(|m| Size(m.total).to_string());
        eprintln!(
            "GPU {index}: {uuid} ({})",
            memory.unwrap_or_else(|_| "size unknown".into())
        );
        gpus.push(Gpu { index, uuid, minor });
    }
    Ok(gpus)
}

/// The host's NVIDIA control nodes and driver files that exist.
fn nvidia_parts(_gpus: &[Gpu]) -> Nvidia {
    let control_nodes = [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
    ]
    .into_iter()
    .filter(|p| Path::new(p).exists())
    .map(str::to_string)
    .collect();
    let lib_dirs = [
        "/usr/local/nvidia/lib64",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib/aarch64-linux-gnu",
    ];
    let mut files = Vec::new();
    for lib in [
        "libcuda.so.1",
        "libnvidia-ml.so.1",
        "libnvidia-ptxjitcompiler.so.1",
    ] {
        if let Some(host) = lib_dirs
            .iter()
            .map(|d| Path::new(d).join(lib))
            .find(|p| p.exists())
        {
            files.push((
                host.display().to_string(),
                format!("/usr/local/nvidia/lib64/{lib}"),
            ));
        }
    }
    for bin in ["/usr/local/nvidia/bin/nvidia-smi", "/usr/bin/nvidia-smi"] {
        if Path::new(bin).exists() {
            files.push((bin.to_string(), "/usr/local/nvidia/bin/nvidia-smi".into()));
            break;
        }
    }
    Nvidia {
        control_nodes,
        files,
    }
}
