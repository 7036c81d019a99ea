//! Harness for the shim-with-agent tests: the real `fgpu agent --sim`, real cgroups in the v2
//! hierarchy, and workloads (fgpu-sim-load, or this test binary as a client) with the shim
//! preloaded, each in its own PID namespace like a container.
//!
//! Tests named `privileged_*` need root. Without root they fail, unless
//! `FGPU_SKIP_PRIVILEGED=1` asks to skip them.

use super::{NO_AGENT, target_dir};
use fgpu_testkit::agent::{AgentPaths, SimAgent, containers_socket_for};
#[allow(unused_imports)] // each test binary uses its own part of the harness
pub use fgpu_testkit::{Cgroup, mono_ns, privileged, unique};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

fn need(p: PathBuf) -> PathBuf {
    assert!(
        p.exists(),
        "{} is missing: build first (`cargo build -p fgpu-shim -p fgpu-sim -p fgpu-agent` with \
         the same profile and target dir)",
        p.display()
    );
    p
}

/// One test's world: the simulated driver in a directory of its own (libcuda.so.1 and
/// libnvidia-ml.so.1 → libfgpu_sim.so, fgpu-sim-load), a simulated device state file, and
/// paths for an agent's socket, state and pinned kernel state.
pub struct AgentWorld {
    pub sim_dir: PathBuf,
    pub sim_state: PathBuf,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub bpf_dir: PathBuf,
    pub shim: PathBuf,
    pub fgpu: PathBuf,
    pub load: PathBuf,
}

impl AgentWorld {
    pub fn new(name: &str) -> Self {
        let t = target_dir();
        let shim = need(t.join("libfgpu.so"));
        let sim = need(t.join("libfgpu_sim.so"));
        let load = need(t.join("fgpu-sim-load"));
        let fgpu = need(t.join("fgpu"));
        let u = unique(name);
        let base = std::env::temp_dir().join(format!("fgpu-shim-agent-{u}"));
        let _ = std::fs::remove_dir_all(&base);
        let sim_dir = base.join("sim");
        std::fs::create_dir_all(&sim_dir).unwrap();
        for n in ["libcuda.so.1", "libnvidia-ml.so.1"] {
            std::os::unix::fs::symlink(&sim, sim_dir.join(n)).unwrap();
        }
        std::os::unix::fs::symlink(&load, sim_dir.join("fgpu-sim-load")).unwrap();
        Self {
            sim_state: Path::new("/dev/shm").join(format!("fgpu-shim-agent-sim-{u}")),
            socket: base.join("fgpu.sock"),
            state_dir: base.join("state"),
            bpf_dir: Path::new("/sys/fs/bpf").join(format!("fgpu-shim-test-{u}")),
            sim_dir,
            shim,
            fgpu,
            load: base.join("sim/fgpu-sim-load"),
        }
    }

    /// Starts `fgpu agent --sim` on this world's socket, state and pinned kernel state (a
    /// second start after [`Agent::crash`] is a restart).
    pub fn agent(&self) -> Agent {
        let log = self
            .state_dir
            .with_file_name(format!("agent-{}.log", unique("log")));
        SimAgent::start(
            &AgentPaths {
                fgpu: &self.fgpu,
                sim_dir: &self.sim_dir,
                socket: &self.socket,
                state_dir: &self.state_dir,
                bpf_dir: &self.bpf_dir,
                log: &log,
            },
            &[],
        )
    }

    /// [`AgentWorld::agent`] whose simulated NVML sees this world's device, of `memory`
    /// (the size its tenants are given with `FGPU_SIM_MEMORY`).
    pub fn agent_seeing(&self, memory: &str) -> Agent {
        self.agent_seeing_with(memory, &[])
    }

    /// [`AgentWorld::agent_seeing`] with more arguments for `fgpu agent`.
    pub fn agent_seeing_with(&self, memory: &str, args: &[&str]) -> Agent {
        self.agent_seeing_gpus(memory, "1", args)
    }

    /// [`AgentWorld::agent_seeing_with`] on a simulator of `gpus` GPUs (the tenants' loads
    /// then need `FGPU_SIM_DEVICES` set alike).
    pub fn agent_seeing_gpus(&self, memory: &str, gpus: &str, args: &[&str]) -> Agent {
        let log = self
            .state_dir
            .with_file_name(format!("agent-{}.log", unique("log")));
        let state = self.sim_state.to_string_lossy().into_owned();
        SimAgent::start_env(
            &AgentPaths {
                fgpu: &self.fgpu,
                sim_dir: &self.sim_dir,
                socket: &self.socket,
                state_dir: &self.state_dir,
                bpf_dir: &self.bpf_dir,
                log: &log,
            },
            args,
            &[
                ("FGPU_SIM_STATE", &state),
                ("FGPU_SIM_MEMORY", memory),
                ("FGPU_SIM_DEVICES", gpus),
            ],
        )
    }

    /// The parking tests' usual pair of containers: `a` parkable (`--memory 1500MiB
    /// --park-after 1s`), `b` the one that asks for room (`--memory 1500MiB`).
    pub fn parking_pair(&self, a: &str, b: &str) -> (Cgroup, Cgroup) {
        let (a, b) = (Cgroup::new(a), Cgroup::new(b));
        self.set_limits(&a, &["--memory", "1500MiB", "--park-after", "1s"]);
        self.set_limit(&b, "1500MiB");
        (a, b)
    }

    /// `fgpu limit set CGROUP --memory SIZE`; panics if refused.
    pub fn set_limit(&self, cg: &Cgroup, size: &str) {
        self.set_limits(cg, &["--memory", size]);
    }

    /// `fgpu limit set CGROUP OPTIONS...`; panics if refused.
    pub fn set_limits(&self, cg: &Cgroup, options: &[&str]) {
        let out = Command::new(&self.fgpu)
            .args(["limit", "set", &cg.path])
            .args(options)
            .arg("--socket")
            .arg(&self.socket)
            .output()
            .expect("running fgpu limit set");
        assert!(
            out.status.success(),
            "fgpu limit set failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The `fgpu` binary and this world's socket (for threads of a test).
    pub fn fgpu_and_socket(&self) -> (PathBuf, PathBuf) {
        (self.fgpu.clone(), self.socket.clone())
    }

    /// The agent's status row of `cg` (`fgpu status --json`).
    pub fn status_row(&self, cg: &Cgroup) -> serde_json::Value {
        let (ok, out) = self.fgpu(&["status", "--json"]);
        assert!(ok, "fgpu status --json: {out}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("status JSON");
        v.as_array()
            .and_then(|a| a.iter().find(|c| c["cgroup"] == cg.path.as_str()))
            .cloned()
            .unwrap_or_else(|| panic!("no row for {} in {out}", cg.path))
    }

    /// `fgpu ARGS --socket SOCKET`: (success, stdout).
    pub fn fgpu(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(&self.fgpu)
            .args(args)
            .arg("--socket")
            .arg(&self.socket)
            .output()
            .expect("running fgpu");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    /// A command in `cg` and a PID namespace of its own (with its own /proc), the sim on the
    /// library path, the shim preloaded, talking to this world's agent socket.
    pub fn command(
        &self,
        cg: &Cgroup,
        env: &[(&str, &str)],
        program: &Path,
        args: &[&str],
    ) -> Command {
        let mut cmd = Command::new("unshare");
        cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
            .arg(program)
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("LD_LIBRARY_PATH", &self.sim_dir)
            .env("LD_PRELOAD", &self.shim)
            .env("FGPU_SIM_STATE", &self.sim_state)
            .env("FGPU_SIM_MEMORY", "16GiB")
            .env("FGPU_SOCKET", containers_socket_for(&self.socket))
            // Every process here is pid 1 in its namespace, and so is every other for the
            // simulated NVML: per-process figures would mix processes up. Configure it.
            .env("FGPU_CONTEXT_OVERHEAD", "300MiB")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cg.enter_on_exec(&mut cmd);
        cmd
    }

    /// fgpu-sim-load ARGS in `cg`, running in the background.
    pub fn load(&self, cg: &Cgroup, env: &[(&str, &str)], args: &[&str]) -> Proc {
        Proc::start(self.command(cg, env, &self.load, args))
    }

    /// This test binary as a client (see `client`) in `cg`.
    pub fn client(&self, cg: &Cgroup, env: &[(&str, &str)], mode: &str, args: &[&str]) -> Proc {
        let exe = std::env::current_exe().unwrap();
        let mut c = self.command(
            cg,
            env,
            &exe,
            &[
                "--exact",
                "client_entry",
                "--nocapture",
                "-q",
                "--test-threads=1",
            ],
        );
        c.env("FGPU_TEST_CLIENT", mode)
            .env("FGPU_TEST_CLIENT_ARGS", args.join(" "));
        Proc::start(c)
    }
}

impl Drop for AgentWorld {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.sim_state);
        if let Some(base) = self.sim_dir.parent() {
            let _ = std::fs::remove_dir_all(base);
        }
        let _ = std::fs::remove_dir_all(&self.bpf_dir);
    }
}

/// A running agent; SIGTERMed on drop (`crash` SIGKILLs it and keeps its pinned state).
pub type Agent = SimAgent;

/// A process started by [`AgentWorld::load`] or [`AgentWorld::client`]: stdout read line by
/// line, stderr collected in the background.
pub struct Proc {
    child: Child,
    out: BufReader<ChildStdout>,
    err: Option<std::thread::JoinHandle<String>>,
    pub lines: Vec<String>,
}

impl Proc {
    pub fn start(mut c: Command) -> Self {
        let mut child = c.spawn().expect("spawn");
        let stderr = child.stderr.take().unwrap();
        let err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut s);
            s
        });
        let out = BufReader::new(child.stdout.take().unwrap());
        Proc {
            child,
            out,
            err: Some(err),
            lines: Vec::new(),
        }
    }

    /// Reads output lines until one starts with `prefix` (within 30 s); returns it.
    pub fn expect(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut line = String::new();
            let n = self.out.read_line(&mut line).unwrap_or(0);
            assert!(
                n > 0,
                "the process ended before printing '{prefix}'; output so far: {:#?}",
                self.lines
            );
            let line = line.trim_end().to_string();
            self.lines.push(line.clone());
            if line.starts_with(prefix) {
                return line;
            }
            assert!(Instant::now() < deadline, "no '{prefix}' within 30 s");
        }
    }

    /// The host PID of the process started (`unshare`, the namespace's parent).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reads output lines until one starts with `prefix` or the process ends; returns it.
    pub fn next_line(&mut self, prefix: &str) -> Option<String> {
        loop {
            let mut line = String::new();
            if self.out.read_line(&mut line).unwrap_or(0) == 0 {
                return None;
            }
            let line = line.trim_end().to_string();
            self.lines.push(line.clone());
            if line.starts_with(prefix) {
                return Some(line);
            }
        }
    }

    /// Lets a `hold` go on (closes stdin).
    pub fn release(&mut self) {
        if let Some(mut i) = self.child.stdin.take() {
            let _ = i.flush();
        }
    }

    /// Waits for the end (stdin closed); returns (exit code, all stdout lines, stderr).
    pub fn finish(mut self) -> Finished {
        self.release();
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.out, &mut rest);
        self.lines.extend(rest.lines().map(str::to_string));
        let deadline = Instant::now() + Duration::from_secs(60);
        let code = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st.code();
            }
            assert!(
                Instant::now() < deadline,
                "process did not finish: {:?}",
                self.lines
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        Finished {
            code,
            lines: std::mem::take(&mut self.lines),
            stderr: self
                .err
                .take()
                .map(|e| e.join().unwrap())
                .unwrap_or_default(),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a finished process printed.
#[derive(Debug)]
pub struct Finished {
    pub code: Option<i32>,
    pub lines: Vec<String>,
    pub stderr: String,
}

impl Finished {
    /// Results of the alloc steps, in order: Ok(size) or Err(rc).
    pub fn allocs(&self) -> Vec<Result<u64, u64>> {
        allocs(&self.lines)
    }

    /// The first line starting with `prefix`.
    pub fn line(&self, prefix: &str) -> &str {
        self.lines
            .iter()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no '{prefix}' line in {self}"))
    }
}

impl std::fmt::Display for Finished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.code,
            self.lines.join("\n"),
            self.stderr
        )
    }
}

/// Alloc results of fgpu-sim-load lines.
pub fn allocs(lines: &[String]) -> Vec<Result<u64, u64>> {
    lines
        .iter()
        .filter(|l| l.starts_with("alloc "))
        .map(|l| {
            if l.starts_with("alloc ok") {
                Ok(super::field(l, "size"))
            } else {
                Err(super::field(l, "rc"))
            }
        })
        .collect()
}

/// Standalone: the default socket path must not be used by accident in these tests.
pub const NOWHERE: &str = NO_AGENT;

/// An agent world whose simulator directory also has the HIP runtime and ROCm SMI (copies
/// of the simulator), and the path of fgpu-sim-hip.
pub fn hip_world(name: &str) -> (AgentWorld, PathBuf) {
    let w = AgentWorld::new(name);
    let sim = target_dir().join("libfgpu_sim.so");
    for n in ["libamdhip64.so", "librocm_smi64.so"] {
        std::fs::copy(&sim, w.sim_dir.join(n)).unwrap();
    }
    let bin = target_dir().join("fgpu-sim-hip");
    assert!(
        bin.exists(),
        "{} is missing: cargo build -p fgpu-sim",
        bin.display()
    );
    (w, bin)
}
