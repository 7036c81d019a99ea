//! `fgpu kubelet-plugin` as the end-to-end tests run it, and the claims they feed it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::apiserver::ApiServer;
use crate::common::{Agent, Cgroup, sim_dir, unique};

pub fn claim_json(uid: &str, name: &str, memory: &str, compute: &str, pod: &str) -> String {
    format!(
        r#"{{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim",
        "metadata":{{"name":"{name}","namespace":"team-a","uid":"{uid}","resourceVersion":"7"}},
        "spec":{{"devices":{{"requests":[{{"name":"gpu","exactly":{{"deviceClassName":"fgpu.io",
          "capacity":{{"requests":{{"memory":"{memory}","compute":"{compute}"}}}}}}}}]}}}},
        "status":{{"allocation":{{"devices":{{"results":[{{"request":"gpu","driver":"fgpu.io",
          "pool":"node-1","device":"gpu-0","shareID":"{uid}",
          "consumedCapacity":{{"memory":"{memory}","compute":"{compute}"}}}}]}}}},
          "reservedFor":[{{"resource":"pods","name":"pod-{name}","uid":"{pod}"}}]}}}}"#
    )
}

pub fn claim_path(name: &str) -> String {
    format!("/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/{name}")
}

/// A running `fgpu kubelet-plugin`, stopped on drop.
pub struct Plugin {
    child: Child,
    log: PathBuf,
    pub reg_sock: PathBuf,
    pub dra_sock: PathBuf,
}

pub struct PluginDirs {
    pub root: PathBuf,
}

impl PluginDirs {
    pub fn cdi(&self) -> PathBuf {
        self.root.join("cdi")
    }
}

impl Plugin {
    pub fn start(dirs: &PluginDirs, agent: &Agent, api: &ApiServer, parent: &str) -> Self {
        Self::start_via(&[], dirs, agent, api, parent, &[])
    }

    /// [`Plugin::start`] through `wrap` (a command that ends by running the rest of its
    /// arguments, e.g. `unshare --mount`, as a container of its own would run it; `env
    /// VAR=...`), with `extra` arguments.
    pub fn start_via(
        wrap: &[&str],
        dirs: &PluginDirs,
        agent: &Agent,
        api: &ApiServer,
        parent: &str,
        extra: &[&str],
    ) -> Self {
        let log = dirs.root.join(format!("{}.log", unique("plugin")));
        let fgpu = env!("CARGO_BIN_EXE_fgpu");
        let mut cmd = match wrap.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(fgpu);
                c
            }
            None => Command::new(fgpu),
        };
        let child = cmd
            .args([
                "kubelet-plugin",
                "--sim",
                "--log",
                "info",
                "--node-name",
                "node-1",
            ])
            .arg("--api-server")
            .arg(&api.url)
            .arg("--registry-dir")
            .arg(dirs.root.join("plugins_registry"))
            .arg("--plugins-dir")
            .arg(dirs.root.join("plugins"))
            .arg("--cdi-dir")
            .arg(dirs.cdi())
            // The agent's state directory, as the chart has it (the plugin's checkpoint
            // there names the pods in `fgpu status`).
            .arg("--state-dir")
            .arg(&agent.state_dir)
            .arg("--admin-socket")
            .arg(&agent.admin)
            .arg("--socket")
            .arg(&agent.socket)
            .args(["--cgroup-parent", parent])
            .args(extra)
            .env("FGPU_SIM_DIR", sim_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting fgpu kubelet-plugin");
        let mut p = Self {
            child,
            log,
            reg_sock: dirs.root.join("plugins_registry/fgpu.io-reg.sock"),
            dra_sock: dirs.root.join("plugins/fgpu.io/dra.sock"),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(&p.reg_sock).is_err()
            || std::os::unix::net::UnixStream::connect(&p.dra_sock).is_err()
        {
            if let Ok(Some(st)) = p.child.try_wait() {
                panic!("the plugin exited ({st}):\n{}", p.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "the plugin did not start:\n{}",
                p.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        p
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn stop(mut self) {
        // SAFETY: kill on our own, unreaped child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The agent's `limit ls --json`: each cgroup with the limit set on it (`own`).
pub fn own_limits(agent: &Agent) -> Vec<(String, serde_json::Value)> {
    let out = agent.cli(&["limit", "ls", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| (e["cgroup"].as_str().unwrap().to_string(), e["own"].clone()))
        .collect()
}

/// [`own_limits`]: cgroup -> (memory bytes, compute percent) set on it.
pub fn limits(agent: &Agent) -> Vec<(String, Option<u64>, Option<u64>)> {
    own_limits(agent)
        .into_iter()
        .map(|(cg, own)| {
            let (m, c) = (own["memory_bytes"].as_u64(), own["compute_pct"].as_u64());
            (cg, m, c)
        })
        .collect()
}

pub fn limit_of(agent: &Agent, cgroup: &str) -> Option<(Option<u64>, Option<u64>)> {
    limits(agent)
        .into_iter()
        .find(|(c, _, _)| c == cgroup)
        .map(|(_, m, c)| (m, c))
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Test cgroups, removed children first.
pub struct Tree(pub Vec<Cgroup>);

impl Drop for Tree {
    fn drop(&mut self) {
        while let Some(cg) = self.0.pop() {
            drop(cg);
        }
    }
}
