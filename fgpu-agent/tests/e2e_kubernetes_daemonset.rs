//! End-to-end (issue 26, item 3): the chart's DaemonSet as it really runs. The chart is
//! rendered (`helm template`, with this test's host paths as values) and its pod spec is
//! turned into real podman containers the way a kubelet would start them: the init
//! container, then the agent and the kubelet plugin, each with the rendered command, args,
//! env (`fieldRef: spec.nodeName` → the node's name), securityContext (`privileged`), the
//! pod's `hostPID`, every volumeMount of its hostPath volumes (a `Directory` that does not
//! exist fails the pod, as the kubelet's hostPath type check does; `DirectoryOrCreate` is
//! made; `HostToContainer` propagation is `rslave`), all in cgroups directly under one pod
//! cgroup of a kubelet-like tree (`--cgroup-parent`, as the kubelet's container manager
//! places a pod's containers). Each container has a mount namespace of its own — the
//! plugin's calls through the agent's admin door are what break 1 refused. The test
//! kubelet registers the plugin and prepares another pod's claim against the stand-in API
//! server; a workload container of that pod, started with the claim's CDI device, sees the
//! claim's memory and stops at it.
//!
//! What differs from a node, and why:
//! - `--host-process=1` becomes this test's PID: in CI the test runs in a container whose
//!   PID 1 is out of reach (as in e2e_kubernetes_pod.rs);
//! - the simulated driver stands for the NVIDIA one: `driverRoot` is the simulator's
//!   folder's parent, and `--sim` (with `FGPU_SIM_DIR` under /driver-root) is added to the
//!   agent, the plugin and the init container's `fgpu cdi generate`;
//! - the plugin gets `--api-server` (the stand-in, on loopback, hence `--network=host`;
//!   the others run with no network) instead of the in-cluster service account;
//! - the agent pins its maps in a bpffs directory of the test's own (`--bpf-dir`).

mod common;
mod containers;
mod k8s;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Cgroup, privileged, sim_dir, unique};
use containers::{Podman, copy_libs, info_total};
use k8s::apiserver::ApiServer;
use k8s::kubelet;
use k8s::plugin::{Tree, claim_json, claim_path, rt};
use serde_json::Value;

const GIB: u64 = 1 << 30;
const POD_FGPU: &str = "0c3d6f1e-2b4a-4c8e-9f00-0000000000d5";
const POD_B: &str = "0c3d6f1e-2b4a-4c8e-9f00-0000000000db";
const CLAIM_B: &str = "7d1e0c2a-4444-4c8e-9f00-0000000000db";

fn find(tool: &str) -> Option<PathBuf> {
    fgpu_testkit::k8s_tool(tool)
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .into()
}

/// The rendered DaemonSet's pod spec.
fn render(helm: &Path, set: &[String]) -> Value {
    let mut cmd = Command::new(helm);
    cmd.args(["template", "fgpu"])
        .arg(root().join("deploy/helm/fgpu"))
        .args(["--namespace", "fgpu-system"]);
    for s in set {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("running helm");
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v: Value = serde::Deserialize::deserialize(doc).unwrap();
        if v["kind"] == "DaemonSet" {
            return v["spec"]["template"]["spec"].clone();
        }
    }
    panic!("no DaemonSet rendered:\n{text}");
}

/// The image: what deploy/images/agent.Dockerfile puts where the chart expects it
/// (/usr/bin/fgpu, /usr/local/lib/fgpu/libfgpu.so), and the shell and coreutils the init
/// container's script runs, with their C libraries.
fn image(root: &Path) {
    for d in [
        "usr/bin",
        "usr/local/lib/fgpu",
        "bin",
        "proc",
        "sys",
        "dev",
        "tmp",
        "etc",
        "run",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let fgpu = Path::new(env!("CARGO_BIN_EXE_fgpu"));
    let shim = fgpu.with_file_name("libfgpu.so");
    std::fs::copy(fgpu, root.join("usr/bin/fgpu")).unwrap();
    std::fs::copy(&shim, root.join("usr/local/lib/fgpu/libfgpu.so")).unwrap();
    let mut tools: Vec<PathBuf> = vec![fgpu.into()];
    for t in ["sh", "install", "mv"] {
        let p = ["/bin", "/usr/bin"]
            .iter()
            .map(|d| Path::new(d).join(t))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("no {t} on this host"));
        let dest = root.join(p.strip_prefix("/").unwrap());
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(&p, &dest).unwrap();
        tools.push(p);
    }
    let refs: Vec<&Path> = tools.iter().map(PathBuf::as_path).collect();
    copy_libs(root, &refs);
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n").unwrap();
}

/// What a kubelet makes of one container of `pod`: podman options, and the command line.
struct Run {
    options: Vec<String>,
    argv: Vec<String>,
}

fn container(pod: &Value, c: &Value, node: &str, parent: &str) -> Run {
    let mut options = vec![format!("--cgroup-parent={parent}")];
    if pod["hostPID"] == true {
        options.push("--pid=host".into());
    }
    if c["securityContext"]["privileged"] == true {
        options.push("--privileged".into());
    }
    for e in c["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap();
        let value = match (&e["value"], &e["valueFrom"]["fieldRef"]["fieldPath"]) {
            (Value::String(v), _) => v.clone(),
            (_, Value::String(f)) if f == "spec.nodeName" => node.to_string(),
            other => panic!("env {name}: {other:?} is not something this test resolves"),
        };
        options.push("-e".into());
        options.push(format!("{name}={value}"));
    }
    let volumes = pod["volumes"].as_array().unwrap();
    for m in c["volumeMounts"].as_array().into_iter().flatten() {
        let name = m["name"].as_str().unwrap();
        let v = volumes
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("volumeMount {name} names no volume"));
        let host = v["hostPath"]["path"].as_str().expect("a hostPath volume");
        // The kubelet's hostPath type check (pkg/volume/hostpath/host_path.go
        // checkType): Directory must exist, DirectoryOrCreate is made (0755).
        match v["hostPath"]["type"].as_str().unwrap_or("") {
            "Directory" => assert!(
                Path::new(host).is_dir(),
                "volume {name}: hostPath type check failed: {host} is not a directory \
                 (the pod would not start)"
            ),
            "DirectoryOrCreate" => std::fs::create_dir_all(host).unwrap(),
            t => panic!("volume {name}: hostPath type {t:?} not handled here"),
        }
        let mut opts = Vec::new();
        if m["readOnly"] == true {
            opts.push("ro");
        }
        if m["mountPropagation"] == "HostToContainer" {
            opts.push("rslave");
        }
        let mut spec = format!("{host}:{}", m["mountPath"].as_str().unwrap());
        if !opts.is_empty() {
            spec = format!("{spec}:{}", opts.join(","));
        }
        options.push("-v".into());
        options.push(spec);
    }
    let strings = |k: &str| -> Vec<String> {
        c[k].as_array()
            .into_iter()
            .flatten()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    };
    let mut argv = strings("command");
    argv.extend(strings("args"));
    Run { options, argv }
}

/// `fgpu limit ls --json` through the admin socket (null if it fails).
fn limit_ls(admin: &Path) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_fgpu"))
        .args(["limit", "ls", "--json", "--socket"])
        .arg(admin)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

fn named<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name} in {list}"))
}

fn wait_for_socket(path: &Path, what: &str, logs: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(path).is_err() {
        assert!(
            Instant::now() < deadline,
            "{what}: no {} after 30 s\n{}",
            path.display(),
            logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Containers started with `podman run -d`, stopped and removed on drop (before the pod
/// cgroups they live in).
struct Started<'a> {
    podman: &'a Podman,
    names: Vec<String>,
}

impl Started<'_> {
    fn logs(&self) -> String {
        let mut all = String::new();
        for n in &self.names {
            let out = self.podman.cmd().args(["logs", n]).output().unwrap();
            all += &format!(
                "---- {n}\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        all
    }
}

impl Drop for Started<'_> {
    fn drop(&mut self) {
        for n in self.names.iter().rev() {
            let _ = self
                .podman
                .cmd()
                .args(["rm", "-f", "-t", "5", n])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

#[test]
fn privileged_the_charts_daemonset_in_real_containers_prepares_a_claim_its_workload_stops_at() {
    if !privileged() {
        return;
    }
    let Some(helm) = find("helm") else {
        eprintln!("SKIPPED: helm not found (deploy/helm/fetch-tools.sh; .ci/run installs it)");
        return;
    };
    let rt = rt();
    let podman = Podman::new();
    let t = podman.dir.clone();
    let image_root = t.join("image");
    image(&image_root);

    // A kubelet-like cgroup tree (cgroupfs driver): the fgpu pod and the workload's pod.
    let base = unique("fgpu-e2e-ds");
    let fgpu_pod = format!("{base}/kubepods/burstable/pod{POD_FGPU}");
    let b_pod = format!("{base}/kubepods/besteffort/pod{POD_B}");
    let mut tree = Tree(Vec::new());
    for p in [
        base.clone(),
        format!("{base}/kubepods"),
        format!("{base}/kubepods/burstable"),
        fgpu_pod.clone(),
        format!("{base}/kubepods/besteffort"),
        b_pod.clone(),
    ] {
        tree.0.push(Cgroup::new(&p));
    }

    // A driver name of its own keeps its CDI specs (podman reads /etc/cdi and /var/run/cdi
    // only) apart from anything else on the host.
    let vendor = unique("t").replace('-', "");
    let driver = format!("{vendor}.fgpu.test");
    let api = ApiServer::start();
    api.put(
        &claim_path("b"),
        &claim_json(CLAIM_B, "b", "4Gi", "70", POD_B)
            .replace("\"fgpu.io\"", &format!("\"{driver}\"")),
    );
    api.put(
        "/api/v1/nodes/node-1",
        r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"node-1","uid":"11111111-2222-3333-4444-555555555555"}}"#,
    );

    // The chart with this test's host paths.
    let cg2 = fgpu_testkit::cgroup2_mount();
    let set = vec![
        format!("driverName={driver}"),
        format!("hostDir={}", t.join("opt-fgpu").display()),
        format!("stateDir={}", t.join("state").display()),
        format!("kubeletDir={}", t.join("kubelet").display()),
        "cdiDir=/var/run/cdi".to_string(),
        format!("socketDir={}", t.join("run-fgpu").display()),
        format!("adminSocketDir={}", t.join("run-fgpu-admin").display()),
        format!("cgroupMount={}", cg2.display()),
        format!("kubeletCgroupRoot=/{base}"),
        // The simulated driver's folder's parent as the driver root (mounted at /driver-root).
        format!("driverRoot={}", sim_dir().parent().unwrap().display()),
    ];
    let pod = render(&helm, &set);
    let parent = format!("/{fgpu_pod}");
    let me = std::process::id().to_string();
    let sim_env = format!(
        "FGPU_SIM_DIR=/driver-root/{}",
        sim_dir().file_name().unwrap().to_string_lossy()
    );
    let bpf_dir = PathBuf::from("/sys/fs/bpf").join(unique("fgpu-test-ds"));
    let cdi_files = [
        PathBuf::from(format!("/var/run/cdi/{driver}-gpu.json")),
        PathBuf::from(format!("/var/run/cdi/{driver}-claim_{CLAIM_B}.json")),
    ];
    let mut started = Started {
        podman: &podman,
        names: Vec::new(),
    };
    let start = |started: &mut Started<'_>, run: Run, name: &str, network: &str, detach: bool| {
        let mut c = podman.cmd();
        c.arg("run").args(["--name", name, "--network", network]);
        if detach {
            c.arg("-d");
        }
        c.args(&run.options)
            .args(["-e", &sim_env])
            .arg("--rootfs")
            .arg(&image_root)
            .args(&run.argv);
        let out = c.output().unwrap();
        started.names.push(name.to_string());
        assert!(
            out.status.success(),
            "podman run {name}: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            started.logs()
        );
    };

    let admin = t.join("run-fgpu-admin/fgpu.sock");
    let reg_sock = t.join(format!("kubelet/plugins_registry/{driver}-reg.sock"));
    let dra_sock = t.join(format!("kubelet/plugins/{driver}/dra.sock"));
    // One generation of the DaemonSet's pod: the init container to completion, then the
    // agent and the plugin; their names.
    let pod_up = |started: &mut Started<'_>| -> Vec<String> {
        let first = started.names.len();
        // The init container: copies fgpu and the shim to hostDir, writes the node's spec.
        let mut init = container(
            &pod,
            named(&pod["initContainers"], "install"),
            "node-1",
            &parent,
        );
        let script = init.argv.last_mut().unwrap();
        assert!(script.contains(" cdi generate "), "{script}");
        *script = script.replace(" cdi generate ", " cdi generate --sim ");
        start(started, init, &unique("fgpu-ds-install"), "none", false);
        assert!(
            t.join("opt-fgpu/bin/fgpu").is_file() && t.join("opt-fgpu/lib/libfgpu.so").is_file()
        );
        assert!(
            cdi_files[0].is_file(),
            "no node CDI spec\n{}",
            started.logs()
        );
        // The agent.
        let mut agent = container(&pod, named(&pod["containers"], "agent"), "node-1", &parent);
        let hp = agent
            .argv
            .iter()
            .position(|a| a == "--host-process=1")
            .expect("the chart's agent runs with --host-process=1");
        agent.argv[hp] = format!("--host-process={me}");
        agent.argv.extend([
            "--sim".to_string(),
            "--bpf-dir".into(),
            bpf_dir.display().to_string(),
        ]);
        start(started, agent, &unique("fgpu-ds-agent"), "none", true);
        wait_for_socket(&admin, "the agent", || started.logs());
        wait_for_socket(&t.join("run-fgpu/fgpu.sock"), "the agent", || {
            started.logs()
        });
        // The kubelet plugin.
        let mut plugin = container(
            &pod,
            named(&pod["containers"], "kubelet-plugin"),
            "node-1",
            &parent,
        );
        plugin
            .argv
            .extend(["--sim".to_string(), "--api-server".into(), api.url.clone()]);
        start(started, plugin, &unique("fgpu-ds-plugin"), "host", true);
        wait_for_socket(&reg_sock, "the plugin", || started.logs());
        wait_for_socket(&dra_sock, "the plugin", || started.logs());
        started.names[first..].to_vec()
    };
    let first_pod = pod_up(&mut started);

    let info = rt.block_on(kubelet::register(&reg_sock));
    assert_eq!(info.name, driver);
    assert_eq!(Path::new(&info.endpoint), dra_sock);

    // The claim of pod B is prepared through the agent's admin door, from the plugin's own
    // mount namespace (break 1: refused before --admin-own-pod).
    let claims = vec![kubelet::claim("team-a", "b", CLAIM_B)];
    let resp = rt.block_on(kubelet::prepare(&dra_sock, claims.clone()));
    let r = &resp.claims[CLAIM_B];
    assert_eq!(r.error, "", "{}", started.logs());
    assert_eq!(r.devices.len(), 1, "{r:?}\n{}", started.logs());
    assert_eq!(
        r.devices[0].cdi_device_ids,
        [format!("{driver}/claim={CLAIM_B}")]
    );
    assert!(cdi_files[1].is_file());
    let ls = limit_ls(&admin);
    let b_cg = format!("/{b_pod}");
    let entry = ls
        .as_array()
        .and_then(|a| a.iter().find(|e| e["cgroup"] == b_cg.as_str()))
        .unwrap_or_else(|| panic!("no limit on {b_cg}: {ls}\n{}", started.logs()));
    assert_eq!(entry["own"]["memory_bytes"], 4 * GIB);
    assert_eq!(entry["own"]["compute_pct"], 70);

    // The workload: a container of pod B started with the claim's CDI device (as the
    // kubelet hands the runtime the ids prepare returned). It sees 4 GiB and stops there.
    let b_run = [
        format!("--device={driver}/claim={CLAIM_B}"),
        format!("--cgroup-parent={b_cg}"),
    ];
    let b_run: Vec<&str> = b_run.iter().map(String::as_str).collect();
    let mut w = podman.load(&b_run, &["info", "alloc", "3GiB", "alloc", "1GiB", "hold"]);
    let line = w.expect_line("info");
    assert_eq!(info_total(&line), 4 * GIB, "{line}\n{}", started.logs());
    w.expect_line("ready");
    assert_eq!(
        w.allocs_ok(),
        1,
        "3 GiB fits, 1 GiB more does not: {:?}",
        w.lines
    );
    assert!(
        w.lines.iter().any(|l| l.starts_with("alloc fail rc=2")),
        "{:?}",
        w.lines
    );

    // An upgrade, as the chart's RollingUpdate (maxUnavailable 1, no surge) does it on a
    // node: the old pod's containers stop, the new pod's start (init container again).
    // Limits and the claim checkpoint are on the host (stateDir) and the workload keeps
    // running: its limit holds across the gap and under the new agent, and the kubelet's
    // prepare of the same claim (it calls again for pods started meanwhile) answers the
    // same from the checkpoint.
    for n in first_pod.iter().rev() {
        let out = podman
            .cmd()
            .args(["rm", "-f", "-t", "5", n])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    started.names.retain(|n| !first_pod.contains(n));
    pod_up(&mut started);
    let info = rt.block_on(kubelet::register(&reg_sock));
    assert_eq!(info.name, driver);
    let again = rt.block_on(kubelet::prepare(&dra_sock, claims.clone()));
    assert_eq!(again, resp, "after the upgrade\n{}", started.logs());
    let ls = limit_ls(&admin);
    let entry = ls
        .as_array()
        .and_then(|a| a.iter().find(|e| e["cgroup"] == b_cg.as_str()))
        .unwrap_or_else(|| panic!("the upgrade lost {b_cg}'s limit: {ls}\n{}", started.logs()));
    assert_eq!(entry["own"]["memory_bytes"], 4 * GIB);
    // A second container of pod B, under the new agent: the pod's 4 GiB are the first's
    // 3.3 GiB (3 GiB + its context) and its own context, so 1 GiB is refused, 256 MiB fits.
    let mut w2 = podman.load(&b_run, &["alloc", "1GiB", "alloc", "256MiB"]);
    let (status, err) = w2.finish();
    assert!(status.success(), "{:?} {err}", w2.lines);
    assert_eq!(
        w2.lines
            .iter()
            .filter(|l| l.starts_with("alloc "))
            .map(|l| l.split_whitespace().nth(1).unwrap_or(""))
            .collect::<Vec<_>>(),
        ["fail", "ok"],
        "the pod's limit after the upgrade: {:?}\n{}",
        w2.lines,
        started.logs()
    );
    let (status, err) = w.finish();
    assert!(status.success(), "{:?} {err}", w.lines);

    // Unprepare lifts the limit and removes the claim's spec.
    let un = rt.block_on(kubelet::unprepare(&dra_sock, claims));
    assert_eq!(un.claims[CLAIM_B].error, "");
    assert!(!cdi_files[1].exists());
    drop(started);
    for f in &cdi_files {
        let _ = std::fs::remove_file(f);
    }
    let _ = std::fs::remove_dir_all(&bpf_dir);
    drop(tree);
}
