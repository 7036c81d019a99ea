//! Real containers for the end-to-end tests: podman with runc, configured per test
//! (containers.conf, storage and run directories of its own; cgroupfs driver, no network,
//! file events), containers run from a root filesystem directory the test builds from the
//! host's files (no image, no registry), fgpu's CDI spec generated into /etc/cdi under a
//! kind of the test's own (podman 4.3 reads specs from /etc/cdi and /var/run/cdi only; a
//! unique kind keeps concurrent tests and a node's real `fgpu.io/gpu` spec apart).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::common::{sim_dir, unique};

/// Where the simulated driver appears in containers, and its shared state.
pub const SIM_IN: &str = "/opt/sim";
pub const STATE_IN: &str = "/sim-state";

/// A podman of the test's own.
pub struct Podman {
    pub dir: PathBuf,
    pub rootfs: PathBuf,
    /// The simulated device's state file, shared by every container of the test.
    pub sim_state: PathBuf,
}

impl Podman {
    /// Sets up podman, or panics saying what is missing.
    pub fn new() -> Self {
        for tool in ["podman", "runc"] {
            let ok = Command::new(tool)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success());
            assert!(
                ok,
                "{tool} is not installed: `apt-get install -y podman runc` (.ci/run does)"
            );
        }
        let dir = std::env::temp_dir().join(unique("fgpu-podman"));
        std::fs::create_dir_all(dir.join("sim")).unwrap();
        std::fs::write(
            dir.join("containers.conf"),
            "[containers]\n\
             # RLIMIT_NOFILE cannot be raised in every VM: keep the caller's limits.\n\
             default_ulimits = []\n\
             [engine]\n\
             runtime = \"runc\"\n\
             cgroup_manager = \"cgroupfs\"\n\
             events_logger = \"file\"\n",
        )
        .unwrap();
        let rootfs = dir.join("rootfs");
        build_rootfs(&rootfs);
        let sim_state = dir.join("sim").join("state");
        Self {
            rootfs,
            sim_state,
            dir,
        }
    }

    /// `podman` with this test's configuration and storage.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new("podman");
        c.env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .arg("--root")
            .arg(self.dir.join("storage"))
            .arg("--runroot")
            .arg(self.dir.join("run"))
            .arg("--tmpdir")
            .arg(self.dir.join("tmp"))
            .arg("--events-backend")
            .arg("file");
        c
    }

    /// `podman run -i --rm` of `program args` in the test's root filesystem with the simulated
    /// driver mounted, `run_args` before the root filesystem (`--device`, `-e`, ...).
    pub fn run(&self, run_args: &[&str], program: &str, args: &[&str]) -> Container {
        let name = unique("fgpu-ctr");
        let cidfile = self.dir.join(format!("{name}.cid"));
        let mut c = self.cmd();
        c.args(["run", "-i", "--rm", "--network", "none", "--name", &name])
            .arg("--cidfile")
            .arg(&cidfile)
            .arg("-v")
            .arg(format!("{}:{SIM_IN}:ro", sim_dir().display()))
            .arg("-v")
            .arg(format!(
                "{}:{STATE_IN}",
                self.sim_state.parent().unwrap().display()
            ))
            .args(["-e", &format!("LD_LIBRARY_PATH={SIM_IN}")])
            .args(["-e", &format!("FGPU_SIM_STATE={STATE_IN}/state")])
            // The simulated driver's processes are all PID 1 of their namespaces: NVML cannot
            // tell them apart, so the shim is told the context overhead (as in e2e_limits).
            .args(["-e", "FGPU_CONTEXT_OVERHEAD=300MiB"])
            .args(run_args)
            .arg("--rootfs")
            .arg(&self.rootfs)
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("starting podman run");
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Container {
            child,
            stdout,
            cidfile,
            lines: Vec::new(),
            name,
        }
    }

    /// `fgpu-sim-load ARGS` in a container.
    pub fn load(&self, run_args: &[&str], args: &[&str]) -> Container {
        self.run(run_args, &format!("{SIM_IN}/fgpu-sim-load"), args)
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        // Containers of this test still there (a failed test): gone with their storage.
        let _ = self
            .cmd()
            .args(["rm", "-af", "-t", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A root filesystem with /bin/sh and the C libraries the shell, the simulated driver, its
/// load tool and the shim need, copied from the host; the driver itself is mounted.
fn build_rootfs(root: &Path) {
    for d in ["bin", "proc", "sys", "dev", "tmp", "etc", "run", "opt/sim"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy("/bin/sh", root.join("bin/sh")).unwrap();
    let shim = Path::new(env!("CARGO_BIN_EXE_fgpu")).with_file_name("libfgpu.so");
    let sim = sim_dir();
    copy_libs(
        root,
        &[
            Path::new("/bin/sh"),
            &sim.join("fgpu-sim-load"),
            &sim.join("libcuda.so.1"),
            &shim,
        ],
    );
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n").unwrap();
}

/// fgpu's CDI spec in /etc/cdi under a kind of this test's own, removed on drop.
pub struct CdiSpec {
    pub kind: String,
    pub path: PathBuf,
}

impl CdiSpec {
    /// `fgpu cdi generate` for the agent's sockets, with `extra` options.
    pub fn generate(socket: &Path, admin: &Path, extra: &[&str]) -> Self {
        let vendor = unique("t").replace('-', "");
        let kind = format!("{vendor}.test.fgpu.io/gpu");
        let path = PathBuf::from(format!("/etc/cdi/fgpu-test-{vendor}.json"));
        let fgpu = Path::new(env!("CARGO_BIN_EXE_fgpu"));
        let out = Command::new(fgpu)
            .args(["cdi", "generate", "--sim", "--kind", &kind, "--output"])
            .arg(&path)
            .arg("--socket")
            .arg(socket)
            .arg("--admin-socket")
            .arg(admin)
            .args(extra)
            .env("FGPU_SIM_DIR", sim_dir())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "fgpu cdi generate: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self { kind, path }
    }

    /// `--device KIND=NAME`.
    pub fn device(&self, name: &str) -> String {
        format!("--device={}={name}", self.kind)
    }
}

impl Drop for CdiSpec {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A running `podman run -i`.
pub struct Container {
    child: Child,
    stdout: BufReader<ChildStdout>,
    cidfile: PathBuf,
    pub name: String,
    pub lines: Vec<String>,
}

impl Container {
    /// Reads output lines until one starts with `prefix`; returns it.
    pub fn expect_line(&mut self, prefix: &str) -> String {
        loop {
            let mut line = String::new();
            let n = self.stdout.read_line(&mut line).unwrap();
            if n == 0 {
                let mut err = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                panic!(
                    "the container ended before printing '{prefix}'; output: {:?}\nstderr: {err}",
                    self.lines
                );
            }
            let line = line.trim_end().to_string();
            self.lines.push(line.clone());
            if line.starts_with(prefix) {
                return line;
            }
        }
    }

    /// The container's full id (podman writes it to the cidfile when it creates it).
    pub fn id(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(id) = std::fs::read_to_string(&self.cidfile)
                && id.trim().len() == 64
            {
                return id.trim().to_string();
            }
            assert!(Instant::now() < deadline, "no container id in the cidfile");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn write(&mut self, text: &str) {
        self.child
            .stdin
            .as_mut()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }

    /// Closes stdin (ends `hold`), reads the rest of the output and waits: (status, stderr).
    pub fn finish(&mut self) -> (ExitStatus, String) {
        drop(self.child.stdin.take());
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.stdout, &mut rest);
        self.lines.extend(rest.lines().map(str::to_string));
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        let status = self.child.wait().unwrap();
        (status, err)
    }

    /// Lines of successful allocations so far.
    pub fn allocs_ok(&self) -> usize {
        self.lines
            .iter()
            .filter(|l| l.starts_with("alloc ok"))
            .count()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `info free=F total=T` → T.
pub fn info_total(line: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("total="))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("not an info line: {line}"))
}

/// `fgpu agent --sim` in a privileged podman container with the host's PID and cgroup
/// namespaces, bpffs, tracefs and the cgroup v2 hierarchy mounted, and its two sockets'
/// directories bind-mounted at the same paths as on the host; stopped on drop.
pub struct PodmanAgent {
    podman: Podman,
    pub name: String,
    pub socket: PathBuf,
    pub admin: PathBuf,
    bpf_dir: PathBuf,
}

/// The container options the agent needs (besides its mounts).
pub const AGENT_OPTIONS: [&str; 4] = [
    "--privileged",
    "--pid=host",
    "--cgroupns=host",
    "--network=none",
];

impl PodmanAgent {
    /// `podman run OPTIONS` of `fgpu agent --sim AGENT_ARGS` with the standard mounts (the
    /// cgroup v2 hierarchy only if `cgroup2`).
    pub fn command(
        podman: &Podman,
        name: &str,
        options: &[&str],
        cgroup2: bool,
        agent_args: &[String],
    ) -> Command {
        let rootfs = podman.dir.join("agent-rootfs");
        if !rootfs.exists() {
            build_agent_rootfs(&rootfs);
        }
        let mut c = podman.cmd();
        c.args(["run", "--name", name]).args(options);
        if cgroup2 {
            let cg2 = fgpu_testkit::cgroup2_mount();
            c.arg("-v").arg(format!("{0}:{0}", cg2.display()));
        }
        for dir in ["/sys/fs/bpf", "/sys/kernel/tracing"] {
            c.arg("-v").arg(format!("{dir}:{dir}"));
        }
        let sim = sim_dir();
        c.arg("-v")
            .arg(format!("{0}:{0}:ro", sim.display()))
            .arg("-e")
            .arg(format!("FGPU_SIM_DIR={}", sim.display()));
        for d in ["agent-run", "agent-admin", "agent-state"] {
            let dir = podman.dir.join(d);
            std::fs::create_dir_all(&dir).unwrap();
            c.arg("-v").arg(format!("{0}:{0}", dir.display()));
        }
        c.arg("--rootfs")
            .arg(&rootfs)
            .args(["/usr/bin/fgpu", "agent", "--sim"])
            .args(agent_args);
        c
    }

    /// Starts the agent container and waits (20 s) until both sockets answer.
    pub fn start() -> Self {
        let podman = Podman::new();
        let name = unique("fgpu-agent-ctr");
        let socket = podman.dir.join("agent-run/fgpu.sock");
        let admin = podman.dir.join("agent-admin/fgpu.sock");
        let bpf_dir = PathBuf::from("/sys/fs/bpf").join(unique("fgpu-test-ctr"));
        let args: Vec<String> = [
            "--host-process".to_string(),
            std::process::id().to_string(),
            "--socket".into(),
            socket.display().to_string(),
            "--admin-socket".into(),
            admin.display().to_string(),
            "--state-dir".into(),
            podman.dir.join("agent-state").display().to_string(),
            "--bpf-dir".into(),
            bpf_dir.display().to_string(),
        ]
        .into();
        let mut options = vec!["-d"];
        options.extend(AGENT_OPTIONS);
        let out = Self::command(&podman, &name, &options, true, &args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "podman run of the agent: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let agent = Self {
            podman,
            name,
            socket,
            admin,
            bpf_dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(&agent.admin).is_err()
            || std::os::unix::net::UnixStream::connect(&agent.socket).is_err()
        {
            assert!(
                Instant::now() < deadline,
                "the agent in its container did not start:\n{}",
                agent.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        agent
    }

    /// The agent's log (its container's output).
    pub fn logs(&self) -> String {
        let out = self
            .podman
            .cmd()
            .args(["logs", &self.name])
            .output()
            .unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }
}

impl Drop for PodmanAgent {
    fn drop(&mut self) {
        let _ = self
            .podman
            .cmd()
            .args(["stop", "-t", "5", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        // Unpinning detaches the probes this agent left attached.
        let _ = std::fs::remove_dir_all(&self.bpf_dir);
    }
}

/// The agent's root filesystem: the fgpu binary and its C libraries, from the host.
fn build_agent_rootfs(root: &Path) {
    for d in [
        "usr/bin", "proc", "sys", "dev", "tmp", "etc", "run", "var/lib",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let fgpu = Path::new(env!("CARGO_BIN_EXE_fgpu"));
    std::fs::copy(fgpu, root.join("usr/bin/fgpu")).unwrap();
    copy_libs(root, &[fgpu]);
}

/// Copies the C libraries `binaries` need (ldd) into `root` at the same paths.
pub fn copy_libs(root: &Path, binaries: &[&Path]) {
    let out = Command::new("ldd")
        .args(binaries)
        .output()
        .expect("running ldd");
    let text = String::from_utf8_lossy(&out.stdout);
    for lib in text
        .split_whitespace()
        .filter(|w| w.starts_with('/') && w.contains(".so"))
        .map(|w| w.trim_end_matches(':'))
        .filter(|w| Path::new(w).is_file())
    {
        let dest = root.join(lib.trim_start_matches('/'));
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        if !dest.exists() {
            std::fs::copy(lib, &dest).unwrap();
        }
    }
}
