//! End-to-end: a pod's DRA claims on two GPUs of a simulated two-GPU node (16 GiB each) limit
//! each GPU to the claims allocated on it — 8 GiB / 30 % on gpu-0, 4 GiB / 20 % on gpu-1 —
//! instead of their sum on every GPU; a workload in the pod's container sees 8 GiB on one and
//! 4 GiB on the other and stops at each.
//!
//! Claims that add up past one GPU (12 GiB on each, a tensor-parallel pod) give 12 GiB per GPU
//! and a plain value no larger than a GPU: the agent refused the 24 GiB plain value, and the
//! pod could run without a limit. A claim whose limit the agent refuses fails its prepare: the kubelet
//! gets the error, and neither the claim's CDI spec nor its checkpoint entry is left.
//!
//! The simulator's settings go through this process's environment (`common::sim_node`): this
//! file holds one test.

mod common;
mod k8s;

use fgpu_kubelet_api::stand_in::dra_manager::DraManager;

use common::{Cgroup, privileged, spawn_sim_load, unique};
use k8s::apiserver::ApiServer;
use k8s::kubelet;
use k8s::plugin::{Plugin, PluginDirs, Tree, claim_json, claim_path, own_limits, rt};

const GIB: u64 = 1 << 30;
const POD: &str = "0c3d6f1e-2b4a-4c8e-9f00-0000000000e0";
const CLAIM_0: &str = "7d1e0c2a-4444-4c8e-9f00-0000000000e0";
const CLAIM_1: &str = "7d1e0c2a-5555-4c8e-9f00-0000000000e1";
/// The tensor-parallel pod and its claims (12 GiB on each GPU).
const POD_TP: &str = "0c3d6f1e-2b4a-4c8e-9f00-0000000000e2";
const CLAIM_TP0: &str = "7d1e0c2a-6666-4c8e-9f00-0000000000e2";
const CLAIM_TP1: &str = "7d1e0c2a-7777-4c8e-9f00-0000000000e3";
/// A pod whose claim the agent refuses (more than its GPU: recorded, no scheduler would).
const POD_BAD: &str = "0c3d6f1e-2b4a-4c8e-9f00-0000000000e4";
const CLAIM_BAD: &str = "7d1e0c2a-8888-4c8e-9f00-0000000000e4";
/// The simulated GPUs' NVML UUIDs (by index).
const UUID0: &str = "GPU-5e1a0000-0000-0000-0000-000000000000";
const UUID1: &str = "GPU-5e1a0000-0000-0000-0000-000000000001";

#[test]
fn privileged_a_pods_claims_on_two_gpus_limit_each_gpu_to_its_own() {
    if !privileged() {
        return;
    }
    let (state, agent) = common::sim_node(2);
    let rt = rt();
    let api = ApiServer::start();
    api.put(
        &claim_path("g0"),
        &claim_json(CLAIM_0, "g0", "8Gi", "30", POD),
    );
    api.put(
        &claim_path("g1"),
        &on_gpu1(CLAIM_1, "g1", "4Gi", "20", POD, "g0"),
    );
    api.put(
        &claim_path("tp0"),
        &claim_json(CLAIM_TP0, "tp0", "12Gi", "40", POD_TP),
    );
    api.put(
        &claim_path("tp1"),
        &on_gpu1(CLAIM_TP1, "tp1", "12Gi", "40", POD_TP, "tp0"),
    );
    api.put(
        &claim_path("bad"),
        &claim_json(CLAIM_BAD, "bad", "20Gi", "10", POD_BAD),
    );
    api.put(
        "/api/v1/nodes/node-1",
        r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"node-1","uid":"11111111-2222-3333-4444-555555555555"}}"#,
    );
    let base = unique("fgpu-e2e-k8s-gpus");
    let pod = format!("{base}/kubepods/besteffort/pod{POD}");
    let ctr = format!("{pod}/{}", "e0".repeat(32));
    let mut cgroups = Tree(Vec::new());
    let pod_tp = format!("{base}/kubepods/besteffort/pod{POD_TP}");
    let pod_bad = format!("{base}/kubepods/besteffort/pod{POD_BAD}");
    for p in [
        base.clone(),
        format!("{base}/kubepods"),
        format!("{base}/kubepods/besteffort"),
        pod_tp.clone(),
        pod_bad.clone(),
        pod.clone(),
        ctr.clone(),
    ] {
        cgroups.0.push(Cgroup::new(&p));
    }
    let dirs = PluginDirs {
        root: std::env::temp_dir().join(unique("fgpu-k8s-gpus")),
    };
    std::fs::create_dir_all(&dirs.root).unwrap();
    let plugin = Plugin::start(&dirs, &agent, &api, &format!("/{base}"));
    rt.block_on(kubelet::register(&plugin.reg_sock));

    let mut kdra = DraManager::new(&plugin.dra_sock);
    let claims = [
        kubelet::claim("team-a", "g0", CLAIM_0),
        kubelet::claim("team-a", "g1", CLAIM_1),
    ];
    let devices = rt
        .block_on(kdra.prepare_pod(POD, &claims))
        .unwrap_or_else(|e| panic!("{e}\n{}", plugin.log_text()));
    assert_eq!(devices[CLAIM_0][0].device_name, "gpu-0");
    assert_eq!(devices[CLAIM_1][0].device_name, "gpu-1");

    // The pod's own limit: per GPU its claims there, elsewhere their sum.
    let own = own_limit(&agent, &format!("/{pod}"))
        .unwrap_or_else(|| panic!("the pod is not limited\n{}", plugin.log_text()));
    assert_eq!(
        own["memory_gpus"],
        serde_json::json!({UUID0: 8 * GIB, UUID1: 4 * GIB}),
        "{own}"
    );
    assert_eq!(
        own["compute_gpus"],
        serde_json::json!({UUID0: 30, UUID1: 20}),
        "{own}"
    );
    // Elsewhere (no other GPU here) their sum, which a GPU can hold.
    assert_eq!(own["memory_bytes"], 12 * GIB, "{own}");
    assert_eq!(own["compute_pct"], 50, "{own}");

    // A workload of the pod's container sees and stops at each GPU's own figure.
    let cg = cgroups.0.last().unwrap();
    for (device, total, first) in [("0", 8 * GIB, "7GiB"), ("1", 4 * GIB, "3GiB")] {
        let mut load = spawn_sim_load(
            cg,
            &state,
            Some(&agent),
            None,
            "300MiB",
            &[
                "device", device, "info", "alloc", first, "alloc", "1GiB", "hold",
            ],
        );
        load.expect_line("ready");
        let info = load
            .lines
            .iter()
            .find(|l| l.starts_with("info"))
            .cloned()
            .unwrap_or_default();
        assert!(
            info.contains(&format!("total={total}")),
            "gpu {device}: {}",
            load.lines.join(" | ")
        );
        let allocs: Vec<_> = load
            .lines
            .iter()
            .filter(|l| l.starts_with("alloc"))
            .collect();
        assert!(
            allocs.len() == 2
                && allocs[0].starts_with("alloc ok")
                && allocs[1].contains("fail rc=2"),
            "gpu {device}: {}",
            load.lines.join(" | ")
        );
    }

    // Claims adding up past one GPU: 12 GiB on each, nothing larger than a GPU.
    let tp = [
        kubelet::claim("team-a", "tp0", CLAIM_TP0),
        kubelet::claim("team-a", "tp1", CLAIM_TP1),
    ];
    rt.block_on(kdra.prepare_pod(POD_TP, &tp))
        .unwrap_or_else(|e| panic!("{e}\n{}", plugin.log_text()));
    let own = own_limit(&agent, &format!("/{pod_tp}"))
        .unwrap_or_else(|| panic!("the pod is not limited\n{}", plugin.log_text()));
    assert_eq!(
        own["memory_gpus"],
        serde_json::json!({UUID0: 12 * GIB, UUID1: 12 * GIB}),
        "{own}"
    );
    assert_eq!(
        own["memory_bytes"],
        16 * GIB,
        "no plain value above a GPU: {own}"
    );

    // A limit the agent refuses fails the prepare, and nothing of the claim is left.
    let err = rt
        .block_on(kdra.prepare_pod(POD_BAD, &[kubelet::claim("team-a", "bad", CLAIM_BAD)]))
        .expect_err("a claim whose limit the agent refuses was prepared");
    assert!(
        err.contains("team-a/bad") && err.contains("larger than"),
        "{err}"
    );
    let spec = dirs.cdi().join(format!("fgpu.io-claim_{CLAIM_BAD}.json"));
    assert!(!spec.exists(), "{} left behind", spec.display());
    let ckpt = std::fs::read_to_string(agent.state_dir.join("kubelet-plugin-fgpu.io.json"))
        .unwrap_or_default();
    assert!(!ckpt.contains(CLAIM_BAD), "left in the checkpoint: {ckpt}");
    assert_eq!(own_limit(&agent, &format!("/{pod_bad}")), None);

    rt.block_on(kdra.unprepare_pod(POD_TP)).unwrap();
    rt.block_on(kdra.unprepare_pod(POD)).unwrap();
    assert_eq!(own_limit(&agent, &format!("/{pod}")), None);
    drop(plugin);
    drop(cgroups);
    let _ = std::fs::remove_dir_all(&dirs.root);
}

/// The cgroup's own limit as `fgpu limit ls --json` says it.
fn own_limit(agent: &common::Agent, cgroup: &str) -> Option<serde_json::Value> {
    own_limits(agent)
        .into_iter()
        .find(|(cg, _)| cg == cgroup)
        .map(|(_, own)| own)
}

/// A claim like [`claim_json`]'s, allocated on gpu-1, reserved for the pod of claim `pod_of`.
fn on_gpu1(uid: &str, name: &str, memory: &str, compute: &str, pod: &str, pod_of: &str) -> String {
    let json = claim_json(uid, name, memory, compute, pod)
        .replace(r#""device":"gpu-0""#, r#""device":"gpu-1""#)
        .replace(&format!("pod-{name}"), &format!("pod-{pod_of}"));
    assert!(json.contains(r#""device":"gpu-1""#));
    json
}
