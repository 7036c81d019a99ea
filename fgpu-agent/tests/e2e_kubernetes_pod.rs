//! End-to-end (issue 26, break 1): the Helm chart's DaemonSet runs the agent and the kubelet
//! plugin as two containers of one pod — the host's PID namespace (`hostPID` is a pod
//! setting), a mount namespace each. Here the agent runs in one container cgroup of a
//! kubelet-made pod with `--host-process PID --admin-own-pod`, the plugin in the pod's other
//! container cgroup under `unshare --mount` (a mount namespace of its own, as a container
//! has), and a test kubelet prepares a claim of another pod through it: the limit lands on
//! that pod's cgroup. Without `--admin-own-pod` the agent refuses the plugin (every claim
//! failed so on a real node); callers of another pod, or of the agent's pod in a PID
//! namespace of their own, stay refused.
//!
//! And (issue 26, "a hung agent stalls both gRPC servers"): an agent stopped while the plugin
//! waits on it, in a prepare or in its reconciler, does not keep the kubelet from registering
//! the plugin; resumed, the waiting calls complete.

mod common;
mod k8s;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{Agent, Cgroup, in_cgroup_exe, privileged, unique};
use fgpu_kubelet_api::dra::v1::NodePrepareResourcesResponse;
use fgpu_kubelet_api::stand_in::plugin_watcher;
use k8s::apiserver::ApiServer;
use k8s::kubelet;
use k8s::plugin::{Plugin, PluginDirs, Tree, claim_json, claim_path, limit_of, rt};

const GIB: u64 = 1 << 30;
const POD_FGPU: &str = "0c3d6f1e-2b4a-4c8e-9f00-0000000000f0";
const POD_B: &str = "0c3d6f1e-2b4a-4c8e-9f00-00000000000b";
const CLAIM_B: &str = "7d1e0c2a-2222-4c8e-9f00-00000000000b";

/// `fgpu limit ls` against `agent`, run in cgroup `cg` through `wrap` (e.g. `unshare --mount`).
fn limit_ls_from(agent: &Agent, cg: &Cgroup, wrap: &[&str]) -> Output {
    let exe = in_cgroup_exe(cg, std::path::Path::new(env!("CARGO_BIN_EXE_fgpu")));
    let mut cmd = Command::new(wrap[0]);
    cmd.args(&wrap[1..])
        .arg(&exe)
        .args(["limit", "ls", "--socket"])
        .arg(&agent.admin);
    cmd.output().expect("running fgpu limit ls")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn privileged_the_kubelet_plugin_in_its_own_mount_namespace_prepares_claims_through_the_agents_pod()
{
    if !privileged() {
        return;
    }
    let rt = rt();
    let base = unique("fgpu-e2e-ownpod");
    let fgpu_pod = format!("{base}/kubepods/burstable/pod{POD_FGPU}");
    let b_pod = format!("{base}/kubepods/besteffort/pod{POD_B}");
    let mut tree = Tree(Vec::new());
    for p in [
        base.clone(),
        format!("{base}/kubepods"),
        format!("{base}/kubepods/burstable"),
        fgpu_pod.clone(),
        format!("{fgpu_pod}/{}", "f1".repeat(32)),
        format!("{fgpu_pod}/{}", "f2".repeat(32)),
        format!("{base}/kubepods/besteffort"),
        b_pod.clone(),
        format!("{b_pod}/{}", "b1".repeat(32)),
    ] {
        tree.0.push(Cgroup::new(&p));
    }
    // The host process whose namespaces are the host's: this test (PID 1 may be out of
    // reach in a CI container, as in e2e_containers.rs).
    let me = std::process::id().to_string();
    let own_mount = ["unshare", "--mount", "--propagation", "private"];
    let own_pid_and_mount = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--pid",
        "--fork",
    ];

    // Without --admin-own-pod: the agent's pod's other container is refused, as on a real
    // node before the fix.
    {
        let agent = Agent::start_in_cgroup(&tree.0[4], &["--host-process", &me]);
        let out = limit_ls_from(&agent, &tree.0[5], &own_mount);
        assert!(!out.status.success(), "{}", text(&out));
        assert!(
            text(&out).contains("not in the agent's mount namespace"),
            "{}",
            text(&out)
        );
    }

    let agent = Agent::start_in_cgroup(&tree.0[4], &["--host-process", &me, "--admin-own-pod"]);
    assert!(
        agent
            .log_text()
            .contains("also serves the other containers of the agent's own pod"),
        "{}",
        agent.log_text()
    );
    // Refused still: a container of another pod, and one of the agent's pod in a PID
    // namespace of its own.
    for (cg, wrap, why) in [
        (&tree.0[8], &own_mount[..], "mount"),
        (&tree.0[5], &own_pid_and_mount[..], "PID"),
    ] {
        let out = limit_ls_from(&agent, cg, wrap);
        assert!(!out.status.success(), "{}: {}", cg.path, text(&out));
        assert!(
            text(&out).contains(&format!("not in the agent's {why} namespace")),
            "{}: {}",
            cg.path,
            text(&out)
        );
    }
    // `kubectl exec -c agent -- fgpu limit ls`: the agent's own container, its own mount
    // namespace (an exec'd process joins the container's).
    let out = limit_ls_from(&agent, &tree.0[4], &own_mount);
    assert!(out.status.success(), "{}", text(&out));

    // The plugin, as the DaemonSet's second container, prepares pod B's claim.
    let api = ApiServer::start();
    api.put(
        &claim_path("b"),
        &claim_json(CLAIM_B, "b", "4Gi", "70", POD_B),
    );
    api.put(
        "/api/v1/nodes/node-1",
        r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"node-1","uid":"11111111-2222-3333-4444-555555555555"}}"#,
    );
    let dirs = PluginDirs {
        root: std::env::temp_dir().join(unique("fgpu-k8s-ownpod")),
    };
    std::fs::create_dir_all(&dirs.root).unwrap();
    let plugin_exe = in_cgroup_exe(&tree.0[5], std::path::Path::new("/bin/sh"));
    let mut wrap: Vec<&str> = own_mount.to_vec();
    let plugin_exe = plugin_exe.to_str().unwrap().to_string();
    wrap.extend([plugin_exe.as_str(), "-c", "exec \"$@\"", "sh"]);
    let plugin = Plugin::start_via(&wrap, &dirs, &agent, &api, &format!("/{base}"), &[]);
    let info = rt.block_on(kubelet::register(&plugin.reg_sock));
    assert_eq!(info.name, "fgpu.io");
    let resp = rt.block_on(kubelet::prepare(
        &plugin.dra_sock,
        vec![kubelet::claim("team-a", "b", CLAIM_B)],
    ));
    assert_eq!(
        resp.claims[CLAIM_B].error,
        "",
        "plugin:\n{}\nagent:\n{}",
        plugin.log_text(),
        agent.log_text()
    );
    assert_eq!(
        limit_of(&agent, &format!("/{b_pod}")),
        Some((Some(4 * GIB), Some(70))),
        "{}",
        plugin.log_text()
    );
    plugin.stop();
}

const POD_A: &str = "0c3d6f1e-2b4a-4c8e-9f00-00000000000a";
const POD_C: &str = "0c3d6f1e-2b4a-4c8e-9f00-00000000000c";
const CLAIM_A: &str = "7d1e0c2a-1111-4c8e-9f00-00000000000a";
const CLAIM_C: &str = "7d1e0c2a-3333-4c8e-9f00-00000000000c";

/// The agent's process stopped (SIGSTOP: a hung agent, its sockets still accepting) until
/// this is dropped (SIGCONT), a failed assertion included.
struct Frozen(i32);

impl Frozen {
    fn new(agent: &Agent) -> Self {
        let pid = agent.pid() as i32;
        // SAFETY: a signal to our own, unreaped child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        let frozen = Self(pid);
        let stopped = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('T')))
                .unwrap_or(false)
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !stopped() {
            assert!(Instant::now() < deadline, "the agent did not stop");
            std::thread::sleep(Duration::from_millis(10));
        }
        frozen
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// The kubelet's plugin watcher registers the plugin on a new connection (GetInfo, then
/// NotifyRegistrationStatus) within `limit`: how long it took, or why not.
fn register_within(
    rt: &tokio::runtime::Runtime,
    reg_sock: &std::path::Path,
    limit: Duration,
) -> Result<Duration, String> {
    let t = Instant::now();
    match rt
        .block_on(async { tokio::time::timeout(limit, plugin_watcher::register(reg_sock)).await })
    {
        Ok(r) => r.error.map_or(Ok(t.elapsed()), Err),
        Err(_) => Err(format!("no registration within {limit:?}")),
    }
}

/// A NodePrepareResources of `claim` on a thread of its own: its answer and when it came.
fn prepare_in_background(
    plugin: &Plugin,
    claim: (&str, &str),
) -> std::thread::JoinHandle<(NodePrepareResourcesResponse, Instant)> {
    let dra = plugin.dra_sock.clone();
    let (name, uid) = (claim.0.to_string(), claim.1.to_string());
    std::thread::spawn(move || {
        let r = rt().block_on(kubelet::prepare(
            &dra,
            vec![kubelet::claim("team-a", &name, &uid)],
        ));
        (r, Instant::now())
    })
}

/// Issue 26: "a hung agent stalls both gRPC servers". Every call of the plugin to the agent
/// is a socket call with a 10 s read timeout, made holding the driver's state lock. Made on
/// a runtime thread it stalled the plugin: on the old single-threaded runtime, the one
/// thread; on the two-worker runtime meant to fix it, too (one worker blocked in the call,
/// the other parked on a condition variable, not woken to drive I/O: no connection accepted,
/// GetInfo unanswered); with `block_in_place`, the reconciler (every 200 ms) blocked the
/// thread that also accepts both servers' connections. Now the calls run on tokio's blocking
/// pool (driver.rs, `ask`).
///
/// With the agent stopped: a prepare that needs the agent waits (and a second prepare of a
/// claim prepared already waits behind it: it needs the state lock the first holds, so it is
/// not asserted fast), and the plugin watcher's registration answers within 2 s each time it
/// is tried (the kubelet gives GetInfo 1 s); resumed, both prepares answer (by the agent, not
/// at the 10 s timeout) and the limit is on the pod. Then, stopped again, a pod's cgroup
/// appears, so the reconciler calls the agent: registration still answers within 2 s, and the
/// pod is limited once the agent is resumed.
#[test]
fn privileged_a_hung_agent_does_not_stall_the_plugins_registration() {
    if !privileged() {
        return;
    }
    let rt = rt();
    let agent = Agent::start();
    let api = ApiServer::start();
    for (name, uid, memory, compute, pod) in [
        ("a", CLAIM_A, "8Gi", "30", POD_A),
        ("b", CLAIM_B, "4Gi", "70", POD_B),
        ("c", CLAIM_C, "2Gi", "20", POD_C),
    ] {
        api.put(
            &claim_path(name),
            &claim_json(uid, name, memory, compute, pod),
        );
    }
    api.put(
        "/api/v1/nodes/node-1",
        r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"node-1","uid":"11111111-2222-3333-4444-555555555555"}}"#,
    );
    let base = unique("fgpu-e2e-hung");
    let pod = |uid: &str| format!("{base}/kubepods/besteffort/pod{uid}");
    let mut tree = Tree(Vec::new());
    for p in [
        base.clone(),
        format!("{base}/kubepods"),
        format!("{base}/kubepods/besteffort"),
        pod(POD_A),
        pod(POD_B),
    ] {
        tree.0.push(Cgroup::new(&p));
    }
    let dirs = PluginDirs {
        root: std::env::temp_dir().join(unique("fgpu-k8s-hung")),
    };
    std::fs::create_dir_all(&dirs.root).unwrap();
    let plugin = Plugin::start(&dirs, &agent, &api, &format!("/{base}"));
    let logs = || {
        format!(
            "plugin:\n{}\nagent:\n{}",
            plugin.log_text(),
            agent.log_text()
        )
    };
    let info = rt.block_on(kubelet::register(&plugin.reg_sock));
    assert_eq!(info.name, "fgpu.io");

    // Claim A prepared as usual; claim C too, its pod's cgroup not made yet (no agent call).
    for (name, uid) in [("a", CLAIM_A), ("c", CLAIM_C)] {
        let r = rt.block_on(kubelet::prepare(
            &plugin.dra_sock,
            vec![kubelet::claim("team-a", name, uid)],
        ));
        assert_eq!(r.claims[uid].error, "", "{}", logs());
    }
    assert_eq!(
        limit_of(&agent, &format!("/{}", pod(POD_A))),
        Some((Some(8 * GIB), Some(30))),
        "{}",
        logs()
    );

    // The agent hangs while claim B is prepared.
    let frozen = Frozen::new(&agent);
    let waiting = prepare_in_background(&plugin, ("b", CLAIM_B));
    std::thread::sleep(Duration::from_millis(300));
    let again = prepare_in_background(&plugin, ("a", CLAIM_A));
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            !waiting.is_finished(),
            "claim B's prepare did not wait for the agent"
        );
        if let Err(e) = register_within(&rt, &plugin.reg_sock, Duration::from_secs(2)) {
            panic!(
                "while a prepare waits on the hung agent, the kubelet cannot register the \
                 plugin: {e}\n{}",
                logs()
            );
        }
    }
    assert!(!waiting.is_finished() && !again.is_finished());
    let resumed = Instant::now();
    drop(frozen);
    for (what, t, uid) in [
        ("claim B's prepare", waiting, CLAIM_B),
        ("claim A's second prepare", again, CLAIM_A),
    ] {
        let (r, at) = t.join().unwrap_or_else(|_| panic!("{what}: {}", logs()));
        assert_eq!(r.claims[uid].error, "", "{what}: {}", logs());
        assert_eq!(
            r.claims[uid].devices[0].cdi_device_ids,
            [format!("fgpu.io/claim={uid}")]
        );
        // Answered by the agent once it runs, not at the 10 s timeout.
        let took = at.saturating_duration_since(resumed);
        assert!(took < Duration::from_secs(5), "{what}: {took:?}");
    }
    assert_eq!(
        limit_of(&agent, &format!("/{}", pod(POD_B))),
        Some((Some(4 * GIB), Some(70))),
        "{}",
        logs()
    );

    // The agent hangs while the reconciler calls it: pod C's cgroup appears.
    let frozen = Frozen::new(&agent);
    tree.0.push(Cgroup::new(&pod(POD_C)));
    std::thread::sleep(Duration::from_millis(600)); // three reconciler ticks
    for _ in 0..2 {
        if let Err(e) = register_within(&rt, &plugin.reg_sock, Duration::from_secs(2)) {
            panic!(
                "while the reconciler waits on the hung agent, the kubelet cannot register \
                 the plugin: {e}\n{}",
                logs()
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    drop(frozen);
    let deadline = Instant::now() + Duration::from_secs(5);
    while limit_of(&agent, &format!("/{}", pod(POD_C))) != Some((Some(2 * GIB), Some(20))) {
        assert!(
            Instant::now() < deadline,
            "pod C not limited once the agent runs again:\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    plugin.stop();
}
