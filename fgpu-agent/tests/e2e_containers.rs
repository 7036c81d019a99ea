//! End-to-end: real containers (podman 4.3 + runc) given the GPU through fgpu's CDI spec
//! (issue 12). The real agent on the simulated driver; the CDI hook registers each
//! container's limit from its environment; the shim, preloaded by the spec, enforces it; the
//! kernel backstop holds it against a process that drops the preload.

mod common;
mod containers;

use std::time::{Duration, Instant};

use std::path::PathBuf;

use common::{Agent, fgpu, ok, privileged};
use containers::{CdiSpec, Podman, PodmanAgent, info_total};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn allocs(n: usize) -> Vec<&'static str> {
    std::iter::repeat_n(["alloc", "256MiB"], n)
        .flatten()
        .collect()
}

/// An agent's two sockets, wherever the agent runs.
pub struct Doors {
    pub socket: PathBuf,
    pub admin: PathBuf,
}

impl Doors {
    /// `fgpu ARGS... --socket <admin socket>`.
    fn cli(&self, args: &[&str]) -> std::process::Output {
        let mut all = args.to_vec();
        all.extend(["--socket", self.admin.to_str().unwrap()]);
        fgpu(&all)
    }

    fn status(&self) -> serde_json::Value {
        serde_json::from_str(&ok(&self.cli(&["status", "--json"]))).unwrap()
    }
}

/// The admin socket's `fgpu limit ls --json`: the cgroups with limits of their own.
fn limited(agent: &Doors) -> Vec<String> {
    let out = ok(&agent.cli(&["limit", "ls", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| e["cgroup"].as_str().unwrap().to_string())
        .collect()
}

/// The whole two-container scenario against an agent serving `socket` and `admin`.
pub fn two_containers(agent: &Doors) {
    let podman = Podman::new();
    let spec = CdiSpec::generate(&agent.socket, &agent.admin, &[]);
    let gpu = spec.device("0");
    let t0 = Instant::now();

    // A: 1 GiB. Two 256 MiB allocations fit beside the 300 MiB context, the third is refused.
    let mut args = vec!["info"];
    args.extend(allocs(3));
    args.push("hold");
    let mut a = podman.load(&[&gpu, "-e", "FGPU_MEMORY_LIMIT=1GiB"], &args);
    // B: 2 GiB, which it cannot raise from inside: it unsets the variable, then sets it to
    // 8 GiB. Then it holds until its limit is raised from the host (an environment's own
    // limit can only lower the agent's, so only B, which dropped its 2 GiB, sees a raise).
    let mut b = podman.run(
        &[&gpu, "-e", "FGPU_MEMORY_LIMIT=2GiB"],
        "/bin/sh",
        &[
            "-c",
            &format!(
                "unset FGPU_MEMORY_LIMIT; FGPU_MEMORY_LIMIT=8GiB GPU_MEM_LIMIT_GB=8 exec {}/fgpu-sim-load info {} hold info {}",
                containers::SIM_IN,
                allocs(7).join(" "),
                allocs(5).join(" ")
            ),
        ],
    );
    assert_eq!(info_total(&a.expect_line("info")), GIB, "A sees its limit");
    assert_eq!(
        info_total(&b.expect_line("info")),
        2 * GIB,
        "B sees its limit"
    );
    a.expect_line("ready");
    b.expect_line("ready");
    let fail = |c: &containers::Container| {
        c.lines
            .iter()
            .filter(|l| l.starts_with("alloc fail"))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(a.allocs_ok(), 2, "A: {:?}", a.lines);
    assert_eq!(
        fail(&a),
        ["alloc fail rc=2 size=268435456 api=mem_alloc"],
        "A"
    );
    assert_eq!(b.allocs_ok(), 6, "B: {:?}", b.lines);
    assert_eq!(
        fail(&b),
        ["alloc fail rc=2 size=268435456 api=mem_alloc"],
        "B"
    );

    // The host sees both, by container id.
    let (ida, idb) = (a.id(), b.id());
    // The kernel's events reach the agent asynchronously: wait (3 s) for both rows to be full.
    let deadline = Instant::now() + Duration::from_secs(3);
    let (ra, rb) = loop {
        let status = agent.status();
        let row = |id: &str| {
            status
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["container_id"] == id)
                .cloned()
        };
        if let (Some(ra), Some(rb)) = (row(&ida), row(&idb))
            && ra["memory_used_bytes"] == 512 * MIB
            && rb["memory_used_bytes"] == 6 * 256 * MIB
        {
            break (ra, rb);
        }
        assert!(
            Instant::now() < deadline,
            "no full status rows for containers {ida} and {idb}: {status:#}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(ra["memory_limit_bytes"], GIB);
    assert_eq!(rb["memory_limit_bytes"], 2 * GIB);
    assert_eq!(ra["memory_used_bytes"], 512 * MIB);
    assert_eq!(rb["memory_used_bytes"], 6 * 256 * MIB);
    let cga = ra["cgroup"].as_str().unwrap().to_string();
    let cgb = rb["cgroup"].as_str().unwrap().to_string();
    assert!(cga.ends_with(&format!("libpod-{ida}")), "{cga}");
    let table = ok(&agent.cli(&["status"]));
    assert!(
        table.contains(&ida[..12]) && table.contains(&idb[..12]),
        "{table}"
    );

    // The limit of a running container, changed from the host by a prefix of its id.
    let (status_a, err_a) = a.finish();
    assert!(status_a.success(), "A: {err_a}");
    let out = ok(&agent.cli(&[
        "limit",
        "set",
        &format!("container:{}", &idb[..12]),
        "--memory",
        "3GiB",
    ]));
    assert!(out.contains(&cgb), "{out}");
    let (status_b, err_b) = b.finish();
    assert!(status_b.success(), "B: {err_b}");
    let hold = b
        .lines
        .iter()
        .position(|l| l == "hold done")
        .expect("B held");
    let after = &b.lines[hold..];
    let info = after.iter().find(|l| l.starts_with("info")).unwrap();
    assert_eq!(
        info_total(info),
        3 * GIB,
        "B sees its raised limit: {after:?}"
    );
    let oks = after.iter().filter(|l| l.starts_with("alloc ok")).count();
    assert_eq!(
        oks, 4,
        "B: 4 more fit 3 GiB beside its 1.5 GiB and the context: {after:?}"
    );
    assert_eq!(
        after.last().unwrap(),
        "alloc fail rc=2 size=268435456 api=mem_alloc"
    );

    // C drops the preload: the kernel kills it at the allocation that crosses 1 GiB.
    let mut bypass = allocs(40);
    bypass.extend(["sleep", "3000"]);
    let mut c = podman.run(
        &[&gpu, "-e", "FGPU_MEMORY_LIMIT=1GiB"],
        "/bin/sh",
        &[
            "-c",
            &format!(
                "LD_PRELOAD= exec {}/fgpu-sim-load {}",
                containers::SIM_IN,
                bypass.join(" ")
            ),
        ],
    );
    let (status_c, err_c) = c.finish();
    assert_eq!(
        status_c.code(),
        Some(137),
        "C was not killed: {:?} {err_c}",
        c.lines
    );
    assert_eq!(
        c.allocs_ok(),
        4,
        "C: exactly the 4 that fit 1 GiB: {:?}",
        c.lines
    );

    // A container asking for a limit that is not one is refused, with the reason.
    let mut d = podman.run(
        &[&gpu, "-e", "FGPU_MEMORY_LIMIT=lots"],
        "/bin/sh",
        &["-c", "echo started"],
    );
    let (status_d, err_d) = d.finish();
    assert!(!status_d.success(), "D started: {:?}", d.lines);
    assert!(d.lines.is_empty(), "D ran: {:?}", d.lines);
    assert!(
        err_d.contains("FGPU_MEMORY_LIMIT=lots") && err_d.contains("refused"),
        "{err_d}"
    );

    // Removed containers leave no limits behind.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<String> = limited(agent)
            .into_iter()
            .filter(|c| c.contains("libpod-"))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "limits left after the containers were removed: {left:?} (A {cga}, B {cgb})"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "4 podman containers (1 GiB, 2 GiB, a bypass, a refused one) in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    drop(spec);
}

#[test]
fn privileged_two_podman_containers_hold_their_limits_from_the_cdi_hook() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    two_containers(&Doors {
        socket: agent.socket.clone(),
        admin: agent.admin.clone(),
    });
}

#[test]
fn privileged_the_agent_in_a_podman_container_says_what_its_container_lacks() {
    if !privileged() {
        return;
    }
    let podman = Podman::new();
    let host = ["--host-process".to_string(), std::process::id().to_string()];
    let base = ["--privileged", "--network=none", "--rm"];
    for (extra, cgroup2, needle) in [
        (
            &["--pid=private", "--cgroupns=host"][..],
            true,
            "--pid=host",
        ),
        (
            &["--pid=host", "--cgroupns=private"][..],
            true,
            "--cgroupns=host",
        ),
        (
            &["--pid=host", "--cgroupns=host"][..],
            false,
            "no cgroup v2 hierarchy is mounted in the agent's container",
        ),
    ] {
        let mut options = base.to_vec();
        options.extend(extra);
        let name = common::unique("fgpu-agent-bad");
        let out = PodmanAgent::command(&podman, &name, &options, cgroup2, &host)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(
            !out.status.success(),
            "{extra:?}: the agent started: {text}"
        );
        assert!(text.contains(needle), "{extra:?}: {text}");
    }
}

#[test]
fn privileged_two_podman_containers_hold_their_limits_with_the_agent_in_a_container() {
    if !privileged() {
        return;
    }
    let agent = PodmanAgent::start();
    let doors = Doors {
        socket: agent.socket.clone(),
        admin: agent.admin.clone(),
    };
    // The host's CLI is served (it is in the namespaces of --host-process).
    let out = ok(&doors.cli(&["status"]));
    assert!(out.contains("probed:"), "{out}");
    two_containers(&doors);
}

/// fgpu's device plugin in Kubernetes gives a container its GPU and, beside it, the node
/// spec's grant device of each resource asked for (`device-plugin-memory`,
/// `device-plugin-compute`), with the variable of that resource. Here podman stands for the
/// kubelet and containerd: the same devices and variables, the runtime writing config.json.
/// A container asking compute only gets the node's default memory and its compute share; a
/// variable of a resource it did not ask for is refused, naming it.
#[test]
fn privileged_device_plugin_grants_decide_what_a_podman_container_may_ask() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let doors = Doors {
        socket: agent.socket.clone(),
        admin: agent.admin.clone(),
    };
    let podman = Podman::new();
    let spec = CdiSpec::generate(
        &agent.socket,
        &agent.admin,
        &["--default-memory", "2GiB", "--max-compute", "90"],
    );
    let gpu = spec.device("0");
    let compute = spec.device("device-plugin-compute");
    let memory = spec.device("device-plugin-memory");

    // Compute only (`fgpu.io/gpu-compute: 1`): the default memory, and the share asked.
    let mut e = podman.load(
        &[&gpu, &compute, "-e", "FGPU_COMPUTE_SHARE=1"],
        &["info", "hold"],
    );
    assert_eq!(
        info_total(&e.expect_line("info")),
        2 * GIB,
        "the default memory: {:?}",
        e.lines
    );
    e.expect_line("ready");
    let out = ok(&doors.cli(&[
        "limit",
        "get",
        &format!("container:{}", &e.id()[..12]),
        "--json",
    ]));
    let got: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(got["own"]["memory_bytes"], 2 * GIB, "{got}");
    assert_eq!(got["own"]["compute_pct"], 1, "{got}");
    let (status, err) = e.finish();
    assert!(status.success(), "{err}");

    // What a container adds for a resource it did not ask for is refused, by name.
    for (devices, env, name) in [
        (
            &compute,
            ["FGPU_COMPUTE_SHARE=1", "FGPU_MEMORY_LIMIT=12GiB"],
            "FGPU_MEMORY_LIMIT",
        ),
        (
            &memory,
            ["FGPU_MEMORY_LIMIT=1GiB", "FGPU_COMPUTE_SHARE=99"],
            "FGPU_COMPUTE_SHARE",
        ),
    ] {
        let mut c = podman.run(
            &[&gpu, devices, "-e", env[0], "-e", env[1]],
            "/bin/sh",
            &["-c", "echo started"],
        );
        let (status, err) = c.finish();
        assert!(!status.success(), "started with {env:?}: {:?}", c.lines);
        assert!(
            err.contains(&format!("{name} is set")) && err.contains("refused"),
            "{err}"
        );
    }
    drop(spec);
}
