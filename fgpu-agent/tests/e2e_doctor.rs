//! End-to-end: `fgpu doctor --sim` against a real agent on the simulated driver (its sockets,
//! the agent answering, the driver libraries and NVML ok), a CDI spec from `fgpu cdi generate
//! --sim` (current) and the same spec naming a library that does not exist (stale), then with
//! the agent stopped (the agent line fails, the exit status is 1).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{Agent, privileged, sim_dir, unique};
use serde_json::Value;

fn fgpu() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fgpu"));
    cmd.env("FGPU_SIM_DIR", sim_dir());
    cmd
}

/// `fgpu doctor --sim` (`--json` if asked) on these sockets and CDI directory; no kubelet.
fn run_doctor(socket: &Path, admin: &Path, cdi_dir: &Path, json: bool) -> Output {
    let mut cmd = fgpu();
    cmd.args(["doctor", "--sim"]);
    if json {
        cmd.arg("--json");
    }
    cmd.arg("--socket")
        .arg(socket)
        .arg("--admin-socket")
        .arg(admin)
        .arg("--cdi-dir")
        .arg(cdi_dir)
        .args(["--kubelet-dir", "/nonexistent/fgpu-test-kubelet"])
        .output()
        .unwrap()
}

/// [`run_doctor`] with `--json`, and its checks.
fn doctor(socket: &Path, admin: &Path, cdi_dir: &Path) -> (Output, Vec<Value>) {
    let out = run_doctor(socket, admin, cdi_dir, true);
    let checks: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor's --json is not a JSON array ({e}):\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, checks)
}

/// The checks named `name`: (status, detail, fix).
fn lines(checks: &[Value], name: &str) -> Vec<(String, String, Option<String>)> {
    let found: Vec<_> = checks
        .iter()
        .filter(|c| c["name"] == name)
        .map(|c| {
            (
                c["status"].as_str().unwrap().to_string(),
                c["detail"].as_str().unwrap().to_string(),
                c["fix"].as_str().map(str::to_string),
            )
        })
        .collect();
    assert!(!found.is_empty(), "no {name} line in {checks:#?}");
    found
}

fn one(checks: &[Value], name: &str) -> (String, String, Option<String>) {
    let mut l = lines(checks, name);
    assert_eq!(l.len(), 1, "{name}: {l:?}");
    l.remove(0)
}

#[test]
fn privileged_doctor_checks_a_running_agent_a_cdi_spec_and_a_stopped_agent() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let cdi_dir = std::env::temp_dir().join(unique("fgpu-doctor-cdi"));
    let spec_path = cdi_dir.join("fgpu.json");
    let generated = fgpu()
        .args(["cdi", "generate", "--sim", "--socket"])
        .arg(&agent.socket)
        .arg("--admin-socket")
        .arg(&agent.admin)
        .arg("--output")
        .arg(&spec_path)
        .output()
        .unwrap();
    assert!(
        generated.status.success(),
        "{}",
        String::from_utf8_lossy(&generated.stderr)
    );

    // With the agent running: everything about it is ok, and so is the fresh spec.
    let (out, checks) = doctor(&agent.socket, &agent.admin, &cdi_dir);
    let shown = format!("{checks:#?}");
    let (status, detail, fix) = one(&checks, "containers-socket");
    assert_eq!(status, "ok", "{shown}");
    assert_eq!(
        detail,
        format!(
            "{}: mode 0666, alone in {} (mode 0755)",
            agent.socket.display(),
            agent.socket.parent().unwrap().display()
        )
    );
    assert_eq!(fix, None);
    let (status, detail, _) = one(&checks, "admin-socket");
    assert_eq!(status, "ok", "{shown}");
    assert_eq!(
        detail,
        format!(
            "{}: root's, mode 0600, in {} (mode 0700)",
            agent.admin.display(),
            agent.admin.parent().unwrap().display()
        )
    );
    let (status, detail, _) = one(&checks, "agent");
    assert_eq!(status, "ok", "{shown}");
    let libcuda = sim_dir().join("libcuda.so.1");
    assert!(
        detail.starts_with(&format!("answering on {} (", agent.admin.display()))
            && detail.contains(&format!("probing {}", libcuda.display()))
            && detail.ends_with(&format!("and on {}", agent.socket.display())),
        "{detail}"
    );
    let libs = lines(&checks, "driver-library");
    assert_eq!(
        libs[0],
        (
            "ok".to_string(),
            format!(
                "{} (CUDA, simulated): exports all 12 probe symbols",
                libcuda.display()
            ),
            None
        )
    );
    // The simulated HIP runtime too (libraries other tests' processes map may follow).
    let simulated: Vec<_> = libs
        .iter()
        .filter(|l| l.1.contains(", simulated)"))
        .collect();
    assert_eq!(simulated.len(), 2, "{libs:?}");
    assert!(simulated.iter().all(|l| l.0 == "ok"), "{libs:?}");
    let (status, detail, _) = one(&checks, "nvml");
    assert_eq!(status, "ok", "{shown}");
    assert!(detail.starts_with("NVML (driver "), "{detail}");
    let (status, detail, _) = one(&checks, "cdi-spec");
    assert_eq!(status, "ok", "{shown}");
    assert!(
        detail.starts_with(&format!("{}: current (", spec_path.display())),
        "{detail}"
    );
    assert_eq!(
        one(&checks, "kubelet-plugin"),
        (
            "skip".to_string(),
            "skipped: no kubelet on this node (/nonexistent/fgpu-test-kubelet does not exist)"
                .to_string(),
            None
        )
    );
    let failed: Vec<_> = checks.iter().filter(|c| c["status"] == "fail").collect();
    assert!(failed.is_empty(), "{failed:#?}");
    assert_eq!(out.status.code(), Some(0), "{shown}");

    // The spec edited to mount a library that is not there: stale, and the run fails.
    let mut spec: Value = serde_json::from_slice(&std::fs::read(&spec_path).unwrap()).unwrap();
    spec["containerEdits"]["mounts"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "hostPath": "/nonexistent/fgpu-test/libcuda.so.1",
            "containerPath": "/usr/local/nvidia/lib64/libcuda.so.1",
            "options": ["ro", "nosuid", "nodev", "rbind"]
        }));
    std::fs::write(&spec_path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    let (out, checks) = doctor(&agent.socket, &agent.admin, &cdi_dir);
    assert_eq!(
        one(&checks, "cdi-spec"),
        (
            "fail".to_string(),
            format!(
                "{} is stale: it names /nonexistent/fgpu-test/libcuda.so.1 (mounted at \
                 /usr/local/nvidia/lib64/libcuda.so.1), which does not exist",
                spec_path.display()
            ),
            Some(format!(
                "regenerate it, with the options it was made with: `sudo fgpu cdi generate \
                 --sim --output {}`",
                spec_path.display()
            ))
        )
    );
    assert_eq!(out.status.code(), Some(1));
    std::fs::remove_dir_all(&cdi_dir).unwrap();

    // The agent stopped: its sockets are gone and nothing answers.
    let (socket, admin): (PathBuf, PathBuf) = (agent.socket.clone(), agent.admin.clone());
    drop(agent);
    let empty_cdi = std::env::temp_dir().join(unique("fgpu-doctor-nocdi"));
    let (out, checks) = doctor(&socket, &admin, &empty_cdi);
    let start = "start the agent: `sudo fgpu agent --sim` (if it runs with --socket or \
                 --admin-socket, give this check the same)";
    assert_eq!(
        one(&checks, "agent"),
        (
            "fail".to_string(),
            format!(
                "not answering: no socket at {}; no socket at {}",
                admin.display(),
                socket.display()
            ),
            Some(start.to_string())
        )
    );
    assert_eq!(one(&checks, "containers-socket").2.as_deref(), Some(start));
    assert_eq!(one(&checks, "cdi-spec").0, "warn");
    assert_eq!(out.status.code(), Some(1));

    // The same as text: the line, and its fix under it.
    let out = run_doctor(&socket, &admin, &empty_cdi, false);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    let at = text
        .lines()
        .position(|l| l.starts_with("fail  agent "))
        .unwrap_or_else(|| panic!("no failed agent line:\n{text}"));
    assert_eq!(
        text.lines().nth(at + 1).map(str::trim_start),
        Some(format!("fix: {start}").as_str()),
        "{text}"
    );
}
