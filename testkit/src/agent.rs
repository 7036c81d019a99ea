//! A real `fgpu agent --sim` process for end-to-end tests: started on given paths, waited
//! for until it serves both its sockets, SIGTERMed on drop (its pinned kernel state removed,
//! which detaches the probes it left) unless it was [`SimAgent::crash`]ed.
//!
//! The agent has two sockets: the admin socket (limits, full status; it also answers Hello)
//! and the containers' socket (Hello and the caller's own status only). [`SimAgent::start`]
//! serves the admin socket on `AgentPaths::socket`, so that a test which talks to one path
//! for everything keeps working, and the containers' socket beside it in
//! `<dir>/containers/<name>` ([`containers_socket_for`]); [`SimAgent::start_doors`] takes
//! both paths.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where an agent runs.
pub struct AgentPaths<'a> {
    /// The `fgpu` binary.
    pub fgpu: &'a Path,
    /// The installed simulated driver (`FGPU_SIM_DIR`).
    pub sim_dir: &'a Path,
    /// The admin socket (limits, full status, and Hello too).
    pub socket: &'a Path,
    pub state_dir: &'a Path,
    pub bpf_dir: &'a Path,
    /// Its stderr (removed on drop).
    pub log: &'a Path,
}

/// A running agent.
pub struct SimAgent {
    child: Child,
    pub log: PathBuf,
    pub bpf_dir: PathBuf,
    /// Limits and the full status (and Hello).
    pub admin_socket: PathBuf,
    /// Hello and the caller's own status only.
    pub containers_socket: PathBuf,
    keep_pins: bool,
}

/// Where [`SimAgent::start`] puts the containers' socket for an admin socket at `admin`:
/// `<dir>/containers/<name>` (a directory of its own, as in production, and not one that
/// holds the admin socket).
pub fn containers_socket_for(admin: &Path) -> PathBuf {
    let name = admin.file_name().unwrap_or("fgpu.sock".as_ref());
    admin
        .parent()
        .unwrap_or(Path::new("/tmp"))
        .join("containers")
        .join(name)
}

impl SimAgent {
    /// Starts `fgpu agent --sim --log info` (or `FGPU_TEST_AGENT_LOG`'s filter, to debug a
    /// test) on `paths` with `extra` arguments and waits (up
    /// to 20 s) until it accepts connections; panics with its log if it does not. The admin
    /// socket is `paths.socket`, the containers' socket [`containers_socket_for`] it.
    pub fn start(paths: &AgentPaths<'_>, extra: &[&str]) -> Self {
        Self::start_doors(paths, &containers_socket_for(paths.socket), extra)
    }

    /// [`SimAgent::start`] with environment variables of its own (e.g. the simulated
    /// device's `FGPU_SIM_STATE` and `FGPU_SIM_MEMORY`, so that its NVML sees the tenants'
    /// device).
    pub fn start_env(paths: &AgentPaths<'_>, extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn(paths, &containers_socket_for(paths.socket), extra, env)
    }

    /// [`SimAgent::start`] with the containers' socket at `containers_socket`.
    pub fn start_doors(paths: &AgentPaths<'_>, containers_socket: &Path, extra: &[&str]) -> Self {
        Self::spawn(paths, containers_socket, extra, &[])
    }

    fn spawn(
        paths: &AgentPaths<'_>,
        containers_socket: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let log = std::env::var("FGPU_TEST_AGENT_LOG").unwrap_or_else(|_| "info".into());
        let child = Command::new(paths.fgpu)
            .args(["agent", "--sim", "--log", &log, "--admin-socket"])
            .arg(paths.socket)
            .arg("--socket")
            .arg(containers_socket)
            .arg("--state-dir")
            .arg(paths.state_dir)
            .arg("--bpf-dir")
            .arg(paths.bpf_dir)
            .args(extra)
            .env("FGPU_SIM_DIR", paths.sim_dir)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(paths.log).expect("creating the agent's log"))
            .spawn()
            .expect("starting fgpu agent");
        let mut agent = SimAgent {
            child,
            log: paths.log.to_path_buf(),
            bpf_dir: paths.bpf_dir.to_path_buf(),
            admin_socket: paths.socket.to_path_buf(),
            containers_socket: containers_socket.to_path_buf(),
            keep_pins: false,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(paths.socket).is_err()
            || std::os::unix::net::UnixStream::connect(containers_socket).is_err()
        {
            if let Ok(Some(status)) = agent.child.try_wait() {
                panic!(
                    "the agent exited ({status}) before serving:\n{}",
                    agent.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the agent did not start:\n{}",
                agent.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        agent
    }

    /// The agent's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILLs the agent, as a crash would: its pinned kernel state stays for the next.
    pub fn crash(mut self) {
        self.keep_pins = true;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for SimAgent {
    fn drop(&mut self) {
        // Only a child not reaped yet: a reaped one's pid may belong to someone else now.
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill on our own, unreaped child's pid.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let _ = self.child.wait();
        }
        // `FGPU_TEST_KEEP_LOGS=DIR` keeps the agent's log (to debug a passing test).
        if let Some(dir) = std::env::var_os("FGPU_TEST_KEEP_LOGS")
            && let Some(name) = self.log.file_name()
        {
            let _ = std::fs::create_dir_all(&dir);
            let _ = std::fs::copy(&self.log, Path::new(&dir).join(name));
        }
        let _ = std::fs::remove_file(&self.log);
        // The directories the agent made for its sockets, if it left them empty.
        for socket in [&self.containers_socket, &self.admin_socket] {
            if let Some(dir) = socket.parent() {
                let _ = std::fs::remove_dir(dir);
            }
        }
        if !self.keep_pins {
            // Unpinning detaches the probes this agent left attached.
            let _ = std::fs::remove_dir_all(&self.bpf_dir);
        }
    }
}
