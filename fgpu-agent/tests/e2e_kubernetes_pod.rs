//! End-to-end (issue 26, break 1): the Helm chart's DaemonSet runs the agent and the kubelet
//! plugin as two containers of one pod — the host's PID namespace (`hostPID` is a pod
//! setting), a mount namespace each. Here the agent runs in one container cgroup of a
//! kubelet-made pod with `--host-process PID --admin-own-pod`, the plugin in the pod's other
//! container cgroup under `unshare --mount` (a mount namespace of its own, as a container
//! has), and a test kubelet prepares a claim of another pod through it: the limit lands on
//! that pod's cgroup. Without `--admin-own-pod` the agent refuses the plugin (every claim
//! failed so on a real node); callers of another pod, or of the agent's pod in a PID
//! namespace of their own, stay refused.

mod common;
mod k8s;

use std::process::{Command, Output};

use common::{Agent, Cgroup, in_cgroup_exe, privileged, unique};
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
