//! A real `fgpu agent --sim` process for end-to-end tests: started on given paths, waited
//! for until it serves its socket, SIGTERMed on drop (its pinned kernel state removed, which
//! detaches the probes it left) unless it was [`SimAgent::crash`]ed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where an agent runs.
pub struct AgentPaths<'a> {
    /// The `fgpu` binary.
    pub fgpu: &'a Path,
    /// The installed simulated driver (`FGPU_SIM_DIR`).
    pub sim_dir: &'a Path,
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
    keep_pins: bool,
}

impl SimAgent {
    /// Starts `fgpu agent --sim --log info` on `paths` with `extra` arguments and waits (up
    /// to 20 s) until it accepts connections; panics with its log if it does not.
    pub fn start(paths: &AgentPaths<'_>, extra: &[&str]) -> Self {
        let child = Command::new(paths.fgpu)
            .args(["agent", "--sim", "--log", "info", "--socket"])
            .arg(paths.socket)
            .arg("--state-dir")
            .arg(paths.state_dir)
            .arg("--bpf-dir")
            .arg(paths.bpf_dir)
            .args(extra)
            .env("FGPU_SIM_DIR", paths.sim_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(paths.log).expect("creating the agent's log"))
            .spawn()
            .expect("starting fgpu agent");
        let mut agent = SimAgent {
            child,
            log: paths.log.to_path_buf(),
            bpf_dir: paths.bpf_dir.to_path_buf(),
            keep_pins: false,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(paths.socket).is_err() {
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
        let _ = std::fs::remove_file(&self.log);
        if !self.keep_pins {
            // Unpinning detaches the probes this agent left attached.
            let _ = std::fs::remove_dir_all(&self.bpf_dir);
        }
    }
}
