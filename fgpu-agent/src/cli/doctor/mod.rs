//! `fgpu doctor`: checks a node for what the agent, the shim, CDI and the kubelet plugin
//! need, and says in plain words what is wrong and how to fix it.
//!
//! Every check is a function of [`Paths`] (and of what the agent's own code finds: the driver
//! library search, NVML), so the unit tests run them against a directory tree of their own
//! (fake `/proc` and `/sys` files, sockets with wrong modes, a stale CDI spec).

mod cdi;
mod driver;
mod elf;
mod kernel;
mod kubelet;
mod sockets;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use serde::Serialize;

/// `fgpu doctor --help`: what each check looks at (set on the subcommand in main.rs).
pub const LONG_ABOUT: &str = "\
Check this node for everything fgpu needs and say what is wrong, in plain words, with the fix.

One line per check: its status, its name, what was found, and for warn and fail the fix on the
line below. ok: as fgpu needs it. warn: works, but not fully or not as intended. fail:
something fgpu needs is missing or broken. skip: does not apply to this node.

  kernel             Linux 5.15 or newer
  btf                kernel BTF (/sys/kernel/btf/vmlinux)
  uprobes            uprobe support (CONFIG_UPROBE_EVENTS: the uprobe PMU)
  cgroup             cgroup v2, pure (/sys/fs/cgroup) or hybrid (/sys/fs/cgroup/unified)
  bpffs              bpffs at /sys/fs/bpf, where --bpf-dir keeps the probes' pinned state
  tracefs            tracefs at /sys/kernel/tracing (or debugfs's tracing)
  privileges         root with CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN)
  driver-library     each library the agent would probe (its own search; --sim, --libcuda)
                     and whether it exports the entry points the probes attach to
  nvml               NVML loads (--sim: the simulated one; --driver-root) and lists GPUs
  containers-socket  present, mode 0666, alone in a root-owned directory
  admin-socket       present, root's, mode 0600 (0660 with --socket-group), in a 0700 directory
  agent              an agent answers a status request on both sockets (--timeout)
  cdi-spec           fgpu's CDI spec (kind --cdi-kind in /etc/cdi, /var/run/cdi) is current:
                     the paths it mounts exist, its hook is there, it names this agent's
                     sockets and the GPUs NVML sees
  kubelet-plugin     the DRA driver or device plugin registered with the kubelet (skipped
                     where there is no /var/lib/kubelet)

Run it as root, with the options the agent runs with (--sim, --driver-root, --libcuda,
--socket, --admin-socket, --bpf-dir). The exit status is 1 if any check fails, else 0
(warnings included). --json prints the checks as an array of {name, status, detail, fix}.

Examples:
  sudo fgpu doctor
  sudo fgpu doctor --sim                  # the simulated driver, as `fgpu agent --sim`
  sudo fgpu doctor --json | jq '.[] | select(.status == \"fail\")'";

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print a JSON array: one object per check, {name, status: ok|warn|fail|skip, detail,
    /// fix (null for ok and skip)}.
    #[arg(long)]
    json: bool,

    /// Check the simulated driver (fgpu-sim) as `fgpu agent --sim` uses it: DIR/libcuda.so.1
    /// and DIR/libnvidia-ml.so.1, DIR being $FGPU_SIM_DIR or `target/sim` beside this binary.
    #[arg(long)]
    sim: bool,

    /// The NVIDIA driver's root, as given to the agent: libnvidia-ml.so.1 is loaded from its
    /// library directories [default: the system's loader path].
    #[arg(long, value_name = "DIR")]
    driver_root: Option<PathBuf>,

    /// A driver library the agent is told to probe with `--libcuda` (repeatable).
    #[arg(long = "libcuda", value_name = "PATH")]
    libcuda: Vec<PathBuf>,

    /// The agent's containers' socket [default: $FGPU_SOCKET, else /run/fgpu/fgpu.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,

    /// The agent's admin socket [default: $FGPU_ADMIN_SOCKET, else /run/fgpu-admin/fgpu.sock].
    #[arg(long, value_name = "PATH")]
    admin_socket: Option<PathBuf>,

    /// The agent's --bpf-dir: where it pins the kernel state (must be on bpffs).
    #[arg(long, value_name = "DIR", default_value = "/sys/fs/bpf/fgpu")]
    bpf_dir: PathBuf,

    /// A directory the container runtimes read CDI specs from (repeatable) [default:
    /// /etc/cdi and /var/run/cdi].
    #[arg(long = "cdi-dir", value_name = "DIR")]
    cdi_dirs: Vec<PathBuf>,

    /// The CDI kind of fgpu's node spec (`fgpu cdi generate --kind`).
    #[arg(long, value_name = "KIND", default_value = crate::cdi::spec::DEFAULT_KIND)]
    cdi_kind: String,

    /// The kubelet's root directory: plugins_registry/, plugins/ and device-plugins/ are
    /// looked at under it; the check is skipped where it does not exist.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/kubelet")]
    kubelet_dir: PathBuf,

    /// The kubelet plugin's --driver-name.
    #[arg(long, value_name = "NAME", default_value = "fgpu.io")]
    driver_name: String,

    /// How long the agent may take to answer on each socket, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 2,
          value_parser = clap::value_parser!(u64).range(1..=60))]
    timeout: u64,
}

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
    Skip,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Warn => "warn",
            Self::Fail => "fail",
            Self::Skip => "skip",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do about it, for warn and fail.
    pub fix: Option<String>,
}

impl Check {
    pub fn ok(name: &'static str, detail: impl Into<String>) -> Self {
        Self {
            name,
            status: Status::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    pub fn skip(name: &'static str, detail: impl Into<String>) -> Self {
        Self {
            name,
            status: Status::Skip,
            detail: detail.into(),
            fix: None,
        }
    }

    pub fn warn(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            name,
            status: Status::Warn,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    pub fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            name,
            status: Status::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// Where the checks look: `root` prefixes the kernel's files (`/proc`, `/sys`, `/boot`; `/`
/// on a real node, a directory tree in tests); the rest are the paths the agent, CDI and the
/// kubelet plugin use.
#[derive(Debug, Clone)]
pub struct Paths {
    pub root: PathBuf,
    pub socket: PathBuf,
    pub admin_socket: PathBuf,
    pub bpf_dir: PathBuf,
    pub cdi_dirs: Vec<PathBuf>,
    pub cdi_kind: String,
    pub kubelet_dir: PathBuf,
    pub driver_name: String,
    /// Checking the simulated driver (fixes then say `--sim`).
    pub sim: bool,
    pub timeout: Duration,
}

impl Paths {
    /// An absolute path of the node, under [`Paths::root`].
    pub fn host(&self, path: impl AsRef<Path>) -> PathBuf {
        let p = path.as_ref();
        self.root.join(p.strip_prefix("/").unwrap_or(p))
    }

    /// ` --sim` when checking the simulated driver: for fixes that name a command.
    fn sim_flag(&self) -> &'static str {
        if self.sim { " --sim" } else { "" }
    }
}

pub fn run(args: &DoctorArgs) -> Result<ExitCode> {
    let paths = Paths {
        root: PathBuf::from("/"),
        socket: args.socket.clone().unwrap_or_else(crate::containers_socket),
        admin_socket: args.admin_socket.clone().unwrap_or_else(|| {
            std::env::var_os("FGPU_ADMIN_SOCKET")
                .map_or_else(|| PathBuf::from(crate::DEFAULT_ADMIN_SOCKET), PathBuf::from)
        }),
        bpf_dir: args.bpf_dir.clone(),
        cdi_dirs: if args.cdi_dirs.is_empty() {
            vec![PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")]
        } else {
            args.cdi_dirs.clone()
        },
        cdi_kind: args.cdi_kind.clone(),
        kubelet_dir: args.kubelet_dir.clone(),
        driver_name: args.driver_name.clone(),
        sim: args.sim,
        timeout: Duration::from_secs(args.timeout),
    };
    let mut checks = kernel::checks(&paths);
    checks.extend(driver::libraries(
        &paths,
        &driver::search(&paths, &args.libcuda),
    ));
    let (nvml, gpus) = driver::nvml(&paths, args.driver_root.as_deref());
    checks.push(nvml);
    checks.extend(sockets::checks(&paths));
    checks.extend(cdi::checks(&paths, gpus.as_deref()));
    checks.push(kubelet::check(&paths));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&checks)?);
    } else {
        print!("{}", render(&checks));
    }
    Ok(exit_code(&checks))
}

/// 1 when any check failed, else 0.
fn exit_code(checks: &[Check]) -> ExitCode {
    if checks.iter().any(|c| c.status == Status::Fail) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The text report: `STATUS  NAME  DETAIL`, the fix on the line below, then a summary.
fn render(checks: &[Check]) -> String {
    let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    let mut out = String::new();
    for c in checks {
        let _ = writeln!(
            out,
            "{:<4}  {:<width$}  {}",
            c.status.word(),
            c.name,
            c.detail
        );
        if let Some(fix) = &c.fix {
            let _ = writeln!(out, "{:<4}  {:<width$}  fix: {fix}", "", "");
        }
    }
    let count = |s: Status| checks.iter().filter(|c| c.status == s).count();
    let _ = writeln!(
        out,
        "{} checks: {} ok, {} warn, {} fail, {} skip",
        checks.len(),
        count(Status::Ok),
        count(Status::Warn),
        count(Status::Fail),
        count(Status::Skip)
    );
    out
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A fresh directory tree standing for a node's `/`, removed on drop.
    pub struct Tree(pub PathBuf);

    impl Tree {
        pub fn new(tag: &str) -> Self {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir =
                std::env::temp_dir().join(format!("fgpu-doctor-{tag}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        /// Writes `text` at `path` (relative to the tree), making its directories.
        pub fn write(&self, path: &str, text: impl AsRef<[u8]>) -> PathBuf {
            let p = self.0.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, text).unwrap();
            p
        }

        pub fn mkdir(&self, path: &str) -> PathBuf {
            let p = self.0.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(&p).unwrap();
            p
        }

        /// The paths of a node rooted at this tree, its sockets and directories inside it.
        pub fn paths(&self) -> Paths {
            Paths {
                root: self.0.clone(),
                socket: self.0.join("run/fgpu/fgpu.sock"),
                admin_socket: self.0.join("run/fgpu-admin/fgpu.sock"),
                bpf_dir: PathBuf::from("/sys/fs/bpf/fgpu"),
                cdi_dirs: vec![self.0.join("etc/cdi"), self.0.join("var/run/cdi")],
                cdi_kind: crate::cdi::spec::DEFAULT_KIND.into(),
                kubelet_dir: self.0.join("var/lib/kubelet"),
                driver_name: "fgpu.io".into(),
                sim: false,
                timeout: Duration::from_millis(500),
            }
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn the_report_puts_the_fix_under_its_line_and_counts_each_status() {
        let checks = [
            Check::ok("btf", "/sys/kernel/btf/vmlinux"),
            Check::fail("agent", "not answering", "start it: `sudo fgpu agent`"),
            Check::skip("kubelet-plugin", "skipped: no kubelet on this node"),
        ];
        assert_eq!(
            render(&checks),
            "ok    btf             /sys/kernel/btf/vmlinux\n\
             fail  agent           not answering\n\
             \x20                     fix: start it: `sudo fgpu agent`\n\
             skip  kubelet-plugin  skipped: no kubelet on this node\n\
             3 checks: 1 ok, 0 warn, 1 fail, 1 skip\n"
        );
        assert_eq!(exit_code(&checks), ExitCode::FAILURE);
        assert_eq!(exit_code(&checks[..1]), ExitCode::SUCCESS);
        let warned = [Check::warn("nvml", "no GPU", "install the driver")];
        assert_eq!(
            exit_code(&warned),
            ExitCode::SUCCESS,
            "warnings do not fail"
        );
    }

    #[test]
    fn json_has_name_status_detail_and_fix() {
        let checks = [
            Check::warn("nvml", "no GPU", "install the driver"),
            Check::ok("btf", "present"),
        ];
        let v: serde_json::Value = serde_json::to_value(checks).unwrap();
        assert_eq!(
            v,
            serde_json::json!([
                {"name": "nvml", "status": "warn", "detail": "no GPU", "fix": "install the driver"},
                {"name": "btf", "status": "ok", "detail": "present", "fix": null},
            ])
        );
    }

    #[test]
    fn node_paths_are_taken_under_the_root() {
        let t = Tree::new("paths");
        let p = t.paths();
        assert_eq!(
            p.host("/proc/self/status"),
            t.0.join("proc/self/status"),
            "an absolute path lands under the root"
        );
    }
}
