//! End-to-end (issue 29): a ResourceClaim makes its pod parkable through the DRA opaque
//! device configuration. The claim's `spec.devices.config` gives fgpu.io `{"parkAfter":
//! "2s"}`; the allocation carries it (source FromClaim) after the DeviceClass's own entry
//! (FromClass, 10m) and another driver's, as the scheduler copies them into
//! `status.allocation.devices.config`. Prepared by the test kubelet, the pod's cgroup gets
//! `park_after_ms: 2000` from the agent, and its container inherits it. A claim whose
//! `parkAfter` is 0 is refused (over the v1beta1 service, which prepares through the same
//! code): the kubelet's error names the claim and the field, and nothing is prepared.

mod common;
mod k8s;

use fgpu_kubelet_api::stand_in::dra_manager::DraManager;
use serde_json::{Value, json};

use common::{Agent, Cgroup, privileged, unique};
use k8s::apiserver::ApiServer;
use k8s::kubelet;
use k8s::plugin::{Plugin, PluginDirs, Tree, claim_json, claim_path, own_limits, rt};

const GIB: u64 = 1 << 30;
const POD: &str = "0c3d6f1e-2b4a-4c8e-9f00-0000000000f0";
const POD_BAD: &str = "0c3d6f1e-2b4a-4c8e-9f00-0000000000f1";
const CLAIM: &str = "7d1e0c2a-6666-4c8e-9f00-0000000000f0";
const CLAIM_BAD: &str = "7d1e0c2a-7777-4c8e-9f00-0000000000f1";

/// The test claim (`claim_json`) with fgpu.io's opaque `parameters` in the claim's
/// `spec.devices.config`, and in its allocation as the scheduler writes it: the class's
/// entry first (FromClass), then the claim's (FromClaim), with another driver's between.
fn parkable_claim(uid: &str, name: &str, pod: &str, parameters: Value) -> String {
    let mut v: Value = serde_json::from_str(&claim_json(uid, name, "4Gi", "20", pod)).unwrap();
    let ours = json!({"opaque": {"driver": "fgpu.io", "parameters": parameters}});
    let other = json!({
        "requests": ["gpu"],
        "opaque": {"driver": "gpu.nvidia.com", "parameters": {"sharing": "timeSlicing"}},
    });
    v["spec"]["devices"]["config"] = json!([ours.clone(), other.clone()]);
    let with_source = |c: &Value, source: &str| {
        let mut c = c.clone();
        c["source"] = source.into();
        c
    };
    let class = json!({"source": "FromClass",
        "opaque": {"driver": "fgpu.io", "parameters": {"parkAfter": "10m"}}});
    v["status"]["allocation"]["devices"]["config"] = json!([
        class,
        with_source(&ours, "FromClaim"),
        with_source(&other, "FromClaim"),
    ]);
    v.to_string()
}

/// `fgpu limit get --json TARGET` on the agent's admin socket.
fn limit_get(agent: &Agent, cgroup: &str) -> Value {
    let out = agent.cli(&["limit", "get", "--json", cgroup]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn privileged_a_claims_park_after_makes_its_pod_parkable() {
    if !privileged() {
        return;
    }
    let rt = rt();
    let agent = Agent::start();
    let api = ApiServer::start();
    api.put(
        &claim_path("parked"),
        &parkable_claim(CLAIM, "parked", POD, json!({"parkAfter": "2s"})),
    );
    api.put(
        &claim_path("bad"),
        &parkable_claim(CLAIM_BAD, "bad", POD_BAD, json!({"parkAfter": "0"})),
    );
    api.put(
        "/api/v1/nodes/node-1",
        r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"node-1","uid":"11111111-2222-3333-4444-555555555555"}}"#,
    );
    let base = unique("fgpu-e2e-k8s-park");
    let pod = format!("{base}/kubepods/besteffort/pod{POD}");
    let ctr = format!("{pod}/{}", "f0".repeat(32));
    let bad_pod = format!("{base}/kubepods/besteffort/pod{POD_BAD}");
    let mut cgroups = Tree(Vec::new());
    for p in [
        base.clone(),
        format!("{base}/kubepods"),
        format!("{base}/kubepods/besteffort"),
        pod.clone(),
        ctr.clone(),
        bad_pod.clone(),
    ] {
        cgroups.0.push(Cgroup::new(&p));
    }
    let dirs = PluginDirs {
        root: std::env::temp_dir().join(unique("fgpu-k8s-park")),
    };
    std::fs::create_dir_all(&dirs.root).unwrap();
    let plugin = Plugin::start(&dirs, &agent, &api, &format!("/{base}"));
    rt.block_on(kubelet::register(&plugin.reg_sock));

    let mut kdra = DraManager::new(&plugin.dra_sock);
    let devices = rt
        .block_on(kdra.prepare_pod(POD, &[kubelet::claim("team-a", "parked", CLAIM)]))
        .unwrap_or_else(|e| panic!("{e}\n{}", plugin.log_text()));
    assert_eq!(devices[CLAIM][0].device_name, "gpu-0");

    // The pod's own limit: the claim's capacity, and its parkAfter over the class's.
    let pod_cg = format!("/{pod}");
    let own = own_limits(&agent)
        .into_iter()
        .find(|(cg, _)| *cg == pod_cg)
        .map(|(_, own)| own)
        .unwrap_or_else(|| panic!("the pod is not limited\n{}", plugin.log_text()));
    assert_eq!(own["memory_bytes"], 4 * GIB, "{own}");
    assert_eq!(own["compute_pct"], 20, "{own}");
    assert_eq!(own["park_after_ms"], 2000, "{own}\n{}", plugin.log_text());
    let got = limit_get(&agent, &pod_cg);
    assert_eq!(got["own"]["park_after_ms"], 2000, "{got}");
    // Its container inherits it.
    let got = limit_get(&agent, &format!("/{ctr}"));
    assert_eq!(got["effective"]["park_after_ms"], 2000, "{got}");
    assert_eq!(got["effective"]["memory_bytes"], 4 * GIB, "{got}");

    // parkAfter 0: refused at prepare, naming the claim and the field; nothing prepared.
    let answer = rt.block_on(kubelet::prepare_v1beta1(
        &plugin.dra_sock,
        vec![kubelet::claim("team-a", "bad", CLAIM_BAD)],
    ));
    let err = &answer.claims[CLAIM_BAD].error;
    for needle in [
        "team-a/bad",
        "status.allocation.devices.config[1]",
        "parkAfter",
        "\"0\"",
    ] {
        assert!(err.contains(needle), "{needle}: {err}");
    }
    assert!(answer.claims[CLAIM_BAD].devices.is_empty());
    assert!(
        !dirs
            .cdi()
            .join(format!("fgpu.io-claim_{CLAIM_BAD}.json"))
            .exists(),
        "no CDI spec for a refused claim"
    );
    let bad_cg = format!("/{bad_pod}");
    assert!(
        own_limits(&agent).iter().all(|(cg, _)| *cg != bad_cg),
        "no limit for a refused claim's pod"
    );

    rt.block_on(kdra.unprepare_pod(POD)).unwrap();
    assert!(own_limits(&agent).iter().all(|(cg, _)| *cg != pod_cg));
    drop(plugin);
    drop(cgroups);
    let _ = std::fs::remove_dir_all(&dirs.root);
}
