//! Harness for the privileged end-to-end tests: a real agent on the simulated driver, real
//! cgroups in the v2 hierarchy, workloads in their own PID namespaces.
//!
//! Tests named `privileged_*` need root. Without root they fail, unless
//! `FGPU_SKIP_PRIVILEGED=1` asks to skip them (what `cargo xtask test --unprivileged` does).
#![allow(dead_code)]

use fgpu_testkit::agent::{AgentPaths, SimAgent};
#[allow(unused_imports)] // each test binary uses its own part of the harness
pub use fgpu_testkit::{Cgroup, cgroup2_mount, mono_ns, privileged, unique};

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// The installed simulated driver: `$FGPU_SIM_DIR` or `<workspace>/target/sim`.
pub fn sim_dir() -> PathBuf {
    let dir = std::env::var_os("FGPU_SIM_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/sim"),
        PathBuf::from,
    );
    assert!(
        dir.join("libcuda.so.1").is_file() && dir.join("fgpu-sim-load").is_file(),
        "the simulated driver is not installed in {}: run `cargo xtask test` (or `cargo xtask build`)",
        dir.display()
    );
    dir
}

/// A running `fgpu agent --sim`, stopped on drop.
pub struct Agent {
    process: SimAgent,
    /// The containers' socket: what shims say Hello on (`FGPU_SOCKET`).
    pub socket: PathBuf,
    /// The admin socket: what the CLI helpers below talk to.
    pub admin: PathBuf,
    pub state_dir: PathBuf,
    /// The agent's pinned kernel state (bpffs); removed on drop unless the agent "crashed".
    pub bpf_dir: PathBuf,
}

impl Agent {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts an agent with its own socket and state directory, plus `extra` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        let name = unique("fgpu-agent");
        let state_dir = std::env::temp_dir().join(format!("{name}.state"));
        Self::start_in(&state_dir, extra)
    }

    /// Starts an agent on an existing state directory (a restart: the same limits file and
    /// the same pinned kernel state).
    pub fn start_in(state_dir: &Path, extra: &[&str]) -> Self {
        let name = unique("fgpu-agent");
        let socket = std::env::temp_dir()
            .join(format!("{name}.run"))
            .join("fgpu.sock");
        Self::start_at(state_dir, &socket, extra)
    }

    /// Starts an agent on a given state directory and containers' socket; its admin socket is
    /// in a directory of its own beside the containers' socket's directory.
    pub fn start_at(state_dir: &Path, socket: &Path, extra: &[&str]) -> Self {
        Self::start_exe(
            Path::new(env!("CARGO_BIN_EXE_fgpu")),
            state_dir,
            socket,
            extra,
        )
    }

    /// Starts an agent in cgroup `cg` (it joins before anything runs), with its own socket
    /// and state directory, plus `extra` arguments: an agent in a container's cgroup.
    pub fn start_in_cgroup(cg: &Cgroup, extra: &[&str]) -> Self {
        let name = unique("fgpu-agent");
        let state_dir = std::env::temp_dir().join(format!("{name}.state"));
        let socket = std::env::temp_dir()
            .join(format!("{name}.run"))
            .join("fgpu.sock");
        let exe = in_cgroup_exe(cg, Path::new(env!("CARGO_BIN_EXE_fgpu")));
        Self::start_exe(&exe, &state_dir, &socket, extra)
    }

    fn start_exe(fgpu: &Path, state_dir: &Path, socket: &Path, extra: &[&str]) -> Self {
        let name = unique("fgpu-agent");
        let socket = socket.to_path_buf();
        let run_dir = socket.parent().expect("a socket path with a directory");
        let admin = run_dir
            .with_file_name(format!(
                "{}.admin",
                run_dir.file_name().unwrap().to_string_lossy()
            ))
            .join("fgpu.sock");
        let bpf_dir = Path::new("/sys/fs/bpf").join(format!(
            "fgpu-test-{}",
            state_dir
                .file_name()
                .unwrap()
                .to_string_lossy()
                .replace('.', "-")
        ));
        let log = std::env::temp_dir().join(format!("{name}.log"));
        let process = SimAgent::start_doors(
            &AgentPaths {
                fgpu,
                sim_dir: &sim_dir(),
                socket: &admin,
                state_dir,
                bpf_dir: &bpf_dir,
                log: &log,
            },
            &socket,
            extra,
        );
        Self {
            process,
            socket,
            admin,
            state_dir: state_dir.to_path_buf(),
            bpf_dir,
        }
    }

    pub fn log_text(&self) -> String {
        self.process.log_text()
    }

    /// The agent's process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Runs `fgpu ARGS... --socket <this agent's admin socket>`.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--socket", self.admin.to_str().unwrap()]);
        fgpu(&all)
    }

    /// `fgpu status --json`, parsed.
    pub fn status(&self) -> serde_json::Value {
        let out = fgpu(&["status", "--json", "--socket", self.admin.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "fgpu status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("status --json is JSON")
    }

    /// `fgpu status --json --detail`, parsed: cgroups, kernel counters, libraries.
    pub fn detail(&self) -> serde_json::Value {
        let out = fgpu(&[
            "status",
            "--json",
            "--detail",
            "--socket",
            self.admin.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "fgpu status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("status --json --detail is JSON")
    }

    /// Paths of the libraries the agent has probes on.
    pub fn libraries(&self) -> Vec<String> {
        self.detail()["libraries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_str().unwrap().to_string())
            .collect()
    }

    /// The status element of one cgroup, if it has one.
    pub fn cgroup_status(&self, cg: &Cgroup) -> Option<serde_json::Value> {
        self.status()
            .as_array()
            .expect("status --json is an array")
            .iter()
            .find(|e| e["cgroup"] == cg.path.as_str())
            .cloned()
    }

    /// Polls until `pred` holds for the cgroup's element (None: no element), or panics.
    pub fn wait_for(
        &self,
        cg: &Cgroup,
        what: &str,
        timeout: Duration,
        pred: impl Fn(Option<&serde_json::Value>) -> bool,
    ) -> Option<serde_json::Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.cgroup_status(cg);
            if pred(s.as_ref()) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; last: {s:?}\nagent log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Agent {
    /// SIGKILLs the agent, as a crash would: its pinned kernel state stays.
    pub fn crash(self) {
        self.process.crash();
    }
}

/// A script that moves itself into cgroup `cg` and then runs `real` with its arguments (the
/// same PID: the process `real` becomes is in `cg` from its first instruction).
pub fn in_cgroup_exe(cg: &Cgroup, real: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = std::env::temp_dir().join(unique("fgpu-in-cgroup"));
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho $$ > '{}/cgroup.procs' || exit 97\nexec '{}' \"$@\"\n",
            cg.dir.display(),
            real.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

pub fn fgpu(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fgpu"))
        .args(args)
        .output()
        .expect("running fgpu")
}

/// A `fgpu-sim-load` run inside `cg`, in its own PID namespace (with its own /proc, as
/// in a real container), on a private simulated device (`state` file).
pub struct Load {
    child: Child,
    stdout: BufReader<ChildStdout>,
    pub lines: Vec<String>,
}

impl Load {
    pub fn spawn(cg: &Cgroup, state: &Path, args: &[&str]) -> Self {
        let sim = sim_dir();
        Self::spawn_program(cg, state, &sim.join("fgpu-sim-load"), args)
    }

    /// `fgpu-sim-load` under the shim (`libfgpu.so` next to the `fgpu` binary), talking to
    /// `agent`. The sim's processes are all PID 1 of their namespaces, so NVML's per-process
    /// figures cannot tell them apart: the context overhead is given instead of measured.
    pub fn spawn_with_shim(cg: &Cgroup, state: &Path, agent: &Agent, args: &[&str]) -> Self {
        let shim = Path::new(env!("CARGO_BIN_EXE_fgpu")).with_file_name("libfgpu.so");
        assert!(
            shim.is_file(),
            "{} is not built: run `cargo xtask test`",
            shim.display()
        );
        Self::spawn_env(
            cg,
            state,
            &sim_dir().join("fgpu-sim-load"),
            args,
            &[
                ("LD_PRELOAD", shim.to_str().unwrap()),
                ("FGPU_SOCKET", agent.socket.to_str().unwrap()),
                ("FGPU_CONTEXT_OVERHEAD", "300MiB"),
            ],
        )
    }

    /// Any program, in `cg` and its own PID namespace, with the sim on LD_LIBRARY_PATH.
    pub fn spawn_program(cg: &Cgroup, state: &Path, program: &Path, args: &[&str]) -> Self {
        Self::spawn_env(cg, state, program, args, &[])
    }

    /// [`Load::spawn_program`] with extra environment variables.
    pub fn spawn_env(
        cg: &Cgroup,
        state: &Path,
        program: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let sim = sim_dir();
        let mut cmd = Command::new("unshare");
        cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
            .arg(program)
            .args(args)
            .env("LD_LIBRARY_PATH", &sim)
            .env("FGPU_SIM_STATE", state)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        cg.enter_on_exec(&mut cmd);
        let mut child = cmd.spawn().expect("starting unshare + fgpu-sim-load");
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            stdout,
            lines: Vec::new(),
        }
    }

    /// Reads output lines until one starts with `prefix`; returns it.
    pub fn expect_line(&mut self, prefix: &str) -> String {
        self.expect_line_or(prefix, String::new)
    }

    /// [`Load::expect_line`]; `context` adds to the failure message (the agent's view).
    pub fn expect_line_or(&mut self, prefix: &str, context: impl FnOnce() -> String) -> String {
        loop {
            let mut line = String::new();
            let n = self.stdout.read_line(&mut line).unwrap();
            assert!(
                n > 0,
                "fgpu-sim-load ended before printing '{prefix}' ({}); output so far: {:?}{}",
                self.how_it_ended(),
                self.lines,
                context()
            );
            let line = line.trim_end().to_string();
            self.lines.push(line.clone());
            if line.starts_with(prefix) {
                return line;
            }
        }
    }

    /// How the process ended (its `unshare` passes the child's exit code on, and says so on
    /// stderr when a signal killed it), with the kernel's last lines when it did not exit 0:
    /// what a failure message needs to tell a kill from a crash or an exit.
    fn how_it_ended(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(2);
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => return "still running 2 s after closing its output".into(),
            }
        };
        if status.success() {
            return format!("{status}");
        }
        let kernel = Command::new("dmesg")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let tail: Vec<_> = kernel.lines().rev().take(8).collect();
        let tail: Vec<_> = tail.into_iter().rev().collect();
        format!("{status}; the kernel's last lines: {tail:?}")
    }

    /// Writes one line to the program's stdin (a go-ahead).
    pub fn send_line(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().expect("stdin still open");
        writeln!(stdin, "{line}").expect("writing to the program's stdin");
        stdin.flush().expect("flushing the program's stdin");
    }

    /// Ends `hold` by closing stdin, without waiting (several loads start together).
    pub fn release(&mut self) {
        drop(self.child.stdin.take());
    }

    /// Ends `hold` by closing stdin, and waits for the exit status.
    pub fn finish(mut self) -> std::process::ExitStatus {
        drop(self.child.stdin.take());
        self.child.wait().unwrap()
    }

    /// Waits for the program to end by itself (stdin stays open).
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child.wait().unwrap()
    }

    /// SIGKILLs the whole PID namespace (unshare --kill-child passes it on).
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `fgpu-sim-load ARGS` without the shim, in `cg` and its own PID namespace, under a shell
/// that prints `exit=STATUS` when it ends (`unshare` cannot pass a SIGKILL on as its own
/// status): 137 is SIGKILL.
pub fn spawn_bypass(cg: &Cgroup, state: &SimState, args: &[&str]) -> Load {
    spawn_sim_load(cg, state, None, None, "", args)
}

/// Reads until the `exit=` line of [`spawn_bypass`]; returns the status it reports.
pub fn exit_status(load: &mut Load) -> i32 {
    let line = load.expect_line("exit=");
    line["exit=".len()..].parse().unwrap()
}

/// `text` without terminal colour sequences (ESC [ ... m).
pub fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The agent's log lines that contain every one of `needles`, as they are now.
pub fn lines_now(agent: &Agent, needles: &[&str]) -> Vec<String> {
    plain(&agent.log_text())
        .lines()
        .filter(|l| needles.iter().all(|x| l.contains(x)))
        .map(str::to_string)
        .collect()
}

/// Waits until the agent log has `n` lines containing every one of `needles`; returns them.
pub fn log_lines(agent: &Agent, needles: &[&str], n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let lines = lines_now(agent, needles);
        if lines.len() >= n || Instant::now() > deadline {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A private simulated-device state file, removed on drop.
pub struct SimState(pub PathBuf);

impl SimState {
    pub fn new() -> Self {
        Self(Path::new("/dev/shm").join(unique("fgpu-sim-test")))
    }
}

impl Drop for SimState {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A Python 3 interpreter for small ctypes clients.
pub fn find_python() -> PathBuf {
    ["python3", "/usr/bin/python3", "/usr/local/bin/python3"]
        .iter()
        .find_map(|p| {
            let out = Command::new(p)
                .arg("-c")
                .arg("import sys; print(sys.executable)")
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        })
        .expect("python3 is needed for the HIP client")
}

/// The stdout of a command that must have succeeded (its output in the panic otherwise).
pub fn ok(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "fgpu failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `fgpu-sim-load ARGS` in `cg` (own PID namespace) on the simulated node of `state`, under
/// the shim when `agent` is given (with `FGPU_CONTEXT_OVERHEAD=context`), with
/// `CUDA_VISIBLE_DEVICES=visible` where given; printing `exit=STATUS` when it ends.
pub fn spawn_sim_load(
    cg: &Cgroup,
    state: &SimState,
    agent: Option<&Agent>,
    visible: Option<&str>,
    context: &str,
    args: &[&str],
) -> Load {
    let load = sim_dir().join("fgpu-sim-load");
    let mut all = vec!["-c", "\"$0\" \"$@\"; echo exit=$?", load.to_str().unwrap()];
    all.extend_from_slice(args);
    let shim = Path::new(env!("CARGO_BIN_EXE_fgpu")).with_file_name("libfgpu.so");
    let socket = agent.map(|a| a.socket.to_string_lossy().into_owned());
    let mut env: Vec<(&str, &str)> = Vec::new();
    if let Some(socket) = &socket {
        env.push(("LD_PRELOAD", shim.to_str().unwrap()));
        env.push(("FGPU_SOCKET", socket));
        env.push(("FGPU_CONTEXT_OVERHEAD", context));
    }
    if let Some(v) = visible {
        env.push(("CUDA_VISIBLE_DEVICES", v));
    }
    Load::spawn_env(cg, &state.0, Path::new("/bin/sh"), &all, &env)
}

/// A simulated node of `gpus` GPUs of 16 GiB and the agent on it (for tests that are the only
/// test of their binary: the simulator's settings go through this process's environment,
/// which every process it starts inherits).
pub fn sim_node(gpus: u32) -> (SimState, Agent) {
    let state = SimState::new();
    // SAFETY: the only test of its binary (callers' contract); nothing else reads the
    // environment now.
    unsafe {
        std::env::set_var("FGPU_SIM_STATE", &state.0);
        std::env::set_var("FGPU_SIM_DEVICES", gpus.to_string());
        std::env::set_var("FGPU_SIM_MEMORY", "16GiB");
    }
    (state, Agent::start())
}

/// One `StatusRequest` on the admin socket, in-process (no CLI start-up in the figure):
/// (milliseconds, rows).
pub fn status_round_trip(admin: &Path) -> (f64, usize) {
    use bytes::{Bytes, BytesMut};
    use fgpu_common::proto::{Frame, Kind};
    use std::io::{Read, Write};
    let start = Instant::now();
    let mut s =
        std::os::unix::net::UnixStream::connect(admin).expect("connecting to the admin socket");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut out = BytesMut::new();
    Frame::new(Kind::StatusRequest, Bytes::new())
        .encode(&mut out)
        .unwrap();
    s.write_all(&out).unwrap();
    let mut buf = BytesMut::new();
    let mut chunk = [0u8; 65536];
    let frame = loop {
        if let Some(f) = Frame::decode(&mut buf).unwrap() {
            break f;
        }
        let n = s.read(&mut chunk).expect("reading the status reply");
        assert!(n > 0, "the agent closed the admin connection");
        buf.extend_from_slice(&chunk[..n]);
    };
    let ms = start.elapsed().as_secs_f64() * 1e3;
    assert_eq!(frame.kind, Kind::StatusReply);
    let report: serde_json::Value = serde_json::from_slice(&frame.payload).unwrap();
    (ms, report["cgroups"].as_array().unwrap().len())
}
