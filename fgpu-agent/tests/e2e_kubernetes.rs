//! End-to-end: `fgpu kubelet-plugin`, fgpu's DRA driver, driven by a test kubelet over the
//! real gRPC APIs (registration, NodePrepareResources, NodeUnprepareResources), with claims
//! served by a local stand-in for the API server, against the real agent on the simulated
//! driver. Two claims on one GPU (8 GiB / 30 % and 4 GiB / 70 %) become limits on two pod
//! cgroups (systemd and cgroupfs layouts); workloads in the pods' containers, in their own
//! PID namespaces under the shim, see and stop at them; two containers of one pod share one
//! budget; a plugin restart answers from its checkpoint; unprepare removes the limits.

mod common;
mod k8s;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::{Agent, Cgroup, Load, SimState, privileged, sim_dir, unique};
use fgpu_kubelet_api::dra::v1 as dra;
use fgpu_kubelet_api::stand_in::dra_manager::DraManager;
use k8s::apiserver::ApiServer;
use k8s::kubelet;
use k8s::plugin::{Plugin, PluginDirs, Tree, claim_json, claim_path, limit_of, limits, rt};

const GIB: u64 = 1 << 30;
const POD_A: &str = "0c3d6f1e-2b4a-4c8e-9f00-00000000000a";
const POD_B: &str = "0c3d6f1e-2b4a-4c8e-9f00-00000000000b";
/// A pod that starts sharing claim A after it was prepared.
const POD_C: &str = "0c3d6f1e-2b4a-4c8e-9f00-00000000000c";
/// A pod whose claim the API server does not have.
const POD_GHOST: &str = "0c3d6f1e-2b4a-4c8e-9f00-00000000000d";
const CLAIM_A: &str = "7d1e0c2a-1111-4c8e-9f00-00000000000a";
const CLAIM_B: &str = "7d1e0c2a-2222-4c8e-9f00-00000000000b";

#[test]
fn privileged_dra_claims_become_pod_limits_that_workloads_see_and_stop_at() {
    if !privileged() {
        return;
    }
    let rt = rt();
    let agent = Agent::start();
    let api = ApiServer::start();
    api.put(
        &claim_path("a"),
        &claim_json(CLAIM_A, "a", "8Gi", "30", POD_A),
    );
    api.put(
        &claim_path("b"),
        &claim_json(CLAIM_B, "b", "4Gi", "70", POD_B),
    );
    api.put("/api/v1/nodes/node-1", r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"node-1","uid":"11111111-2222-3333-4444-555555555555"}}"#);

    // A kubelet-like cgroup tree under a test cgroup: pod A with the systemd driver
    // (burstable), pod B with the cgroupfs driver (best effort); containers below.
    let base = unique("fgpu-e2e-k8s");
    let a_pod = format!(
        "{base}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
        POD_A.replace('-', "_")
    );
    let b_pod = format!("{base}/kubepods/besteffort/pod{POD_B}");
    let mut cgroups = Tree(Vec::new());
    for p in [
        base.clone(),
        format!("{base}/kubepods.slice"),
        format!("{base}/kubepods.slice/kubepods-burstable.slice"),
        a_pod.clone(),
        format!("{a_pod}/cri-containerd-{}.scope", "a1".repeat(32)),
        format!("{a_pod}/cri-containerd-{}.scope", "a2".repeat(32)),
        format!("{base}/kubepods"),
        format!("{base}/kubepods/besteffort"),
        b_pod.clone(),
        format!("{b_pod}/{}", "b1".repeat(32)),
        format!("{base}/kubepods/besteffort/pod{POD_C}"),
    ] {
        cgroups.0.push(Cgroup::new(&p));
    }
    let dirs = PluginDirs {
        root: std::env::temp_dir().join(unique("fgpu-k8s")),
    };
    std::fs::create_dir_all(&dirs.root).unwrap();
    let plugin = Plugin::start_via(
        &[],
        &dirs,
        &agent,
        &api,
        &format!("/{base}"),
        &["--claim-recheck", "1"],
    );

    // Registration handshake, as the kubelet's plugin watcher does it.
    let info = rt.block_on(kubelet::register(&plugin.reg_sock));
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "fgpu.io");
    assert_eq!(Path::new(&info.endpoint), plugin.dra_sock);
    // v1 first (1.34+ kubelets), v1beta1 for 1.32 and 1.33 kubelets.
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );

    // The node's ResourceSlice was applied: one shareable GPU with memory and compute.
    let patches = api.patches();
    let (target, body) = patches
        .iter()
        .find(|(t, _)| t.starts_with("/apis/resource.k8s.io/v1/resourceslices/node-1-fgpu.io"))
        .unwrap_or_else(|| {
            panic!(
                "no ResourceSlice applied: {patches:?}\n{}",
                plugin.log_text()
            )
        });
    assert!(target.contains("fieldManager=fgpu"), "{target}");
    let slice: serde_json::Value = serde_json::from_str(body).unwrap();
    let dev = &slice["spec"]["devices"][0];
    assert_eq!(dev["name"], "gpu-0");
    assert_eq!(dev["allowMultipleAllocations"], true);
    assert_eq!(
        dev["capacity"]["memory"]["value"],
        (16 * GIB).to_string(),
        "the sim's 16 GiB"
    );
    assert_eq!(dev["capacity"]["compute"]["value"], "100");
    assert_eq!(slice["metadata"]["ownerReferences"][0]["kind"], "Node");
    validate_slice(body);

    // Prepare both claims, as a kubelet starting pods A and B does (one call per pod).
    let claims = vec![
        kubelet::claim("team-a", "a", CLAIM_A),
        kubelet::claim("team-a", "b", CLAIM_B),
    ];
    let mut kdra = DraManager::new(&plugin.dra_sock);
    let mut prepared = BTreeMap::new();
    for (pod, claim) in [(POD_A, &claims[..1]), (POD_B, &claims[1..])] {
        let devices = rt
            .block_on(kdra.prepare_pod(pod, claim))
            .unwrap_or_else(|e| panic!("pod {pod} not started: {e}\n{}", plugin.log_text()));
        prepared.extend(devices);
    }
    assert_eq!(kdra.prepare_calls, 2);
    let resp = dra::NodePrepareResourcesResponse {
        claims: prepared
            .iter()
            .map(|(uid, devices)| {
                let devices = devices.clone();
                let r = dra::NodePrepareResourceResponse {
                    devices,
                    error: String::new(),
                };
                (uid.clone(), r)
            })
            .collect(),
    };
    for uid in [CLAIM_A, CLAIM_B] {
        let r = &resp.claims[uid];
        assert_eq!(r.error, "", "{}", plugin.log_text());
        assert_eq!(r.devices.len(), 1);
        assert_eq!(r.devices[0].pool_name, "node-1");
        assert_eq!(r.devices[0].device_name, "gpu-0");
        assert_eq!(r.devices[0].request_names, ["gpu"]);
        assert_eq!(
            r.devices[0].cdi_device_ids,
            [format!("fgpu.io/claim={uid}")]
        );
        let spec_file = dirs.cdi().join(format!("fgpu.io-claim_{uid}.json"));
        let spec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&spec_file).unwrap()).unwrap();
        assert_eq!(spec["kind"], "fgpu.io/claim");
        assert_eq!(spec["devices"][0]["name"], uid);
        let env = spec["devices"][0]["containerEdits"]["env"].to_string();
        assert!(env.contains("FGPU_CLAIM=team-a/"), "{env}");
        assert!(
            spec["containerEdits"]["hooks"].is_null(),
            "no env-driven hook: {spec}"
        );
    }
    let a_cg = format!("/{a_pod}");
    let b_cg = format!("/{b_pod}");
    assert_eq!(
        limit_of(&agent, &a_cg),
        Some((Some(8 * GIB), Some(30))),
        "{}",
        plugin.log_text()
    );
    assert_eq!(limit_of(&agent, &b_cg), Some((Some(4 * GIB), Some(70))));

    // A pod that starts sharing claim A now gets no prepare call from a kubelet (it prepares
    // a claim once per node): the plugin sees it in the claim's reservedFor and limits it
    // as it did pod A.
    let c_cg = format!("/{base}/kubepods/besteffort/pod{POD_C}");
    assert_eq!(limit_of(&agent, &c_cg), None);
    let c_devices = rt.block_on(kdra.prepare_pod(POD_C, &claims[..1])).unwrap();
    assert_eq!(
        kdra.prepare_calls, 2,
        "claim A is prepared on the node: no call"
    );
    assert_eq!(c_devices[CLAIM_A], prepared[CLAIM_A]);
    let one = format!(r#"{{"resource":"pods","name":"pod-a","uid":"{POD_A}"}}"#);
    let shared = claim_json(CLAIM_A, "a", "8Gi", "30", POD_A).replace(
        &one,
        &format!(r#"{one},{{"resource":"pods","name":"pod-c","uid":"{POD_C}"}}"#),
    );
    assert_ne!(shared, claim_json(CLAIM_A, "a", "8Gi", "30", POD_A));
    api.put(&claim_path("a"), &shared);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while limit_of(&agent, &c_cg) != Some((Some(8 * GIB), Some(30))) {
        assert!(
            std::time::Instant::now() < deadline,
            "pod C joined claim A but was not limited in 10 s: {:?}\n{}",
            limits(&agent),
            plugin.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(limit_of(&agent, &a_cg), Some((Some(8 * GIB), Some(30))));

    // `pod:` targets: by UID, and by namespace/name through the API server.
    api.put(
        "/api/v1/namespaces/team-a/pods/pod-b",
        &format!(r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"pod-b","namespace":"team-a","uid":"{POD_B}"}}}}"#),
    );
    for (target, cg) in [
        (format!("pod:{POD_A}"), &a_cg),
        ("pod:team-a/pod-b".to_string(), &b_cg),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_fgpu"))
            .args(["limit", "get", &target, "--json", "--socket"])
            .arg(&agent.admin)
            .env("FGPU_KUBEPODS_PARENT", format!("/{base}"))
            .env("FGPU_API_SERVER", &api.url)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{target}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(e["cgroup"], cg.as_str(), "{target}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_fgpu"))
        .args(["limit", "get", "pod:team-a/nobody", "--socket"])
        .arg(&agent.admin)
        .env("FGPU_API_SERVER", &api.url)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("pod:team-a/nobody"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Workloads in the pods' containers see their pod's memory and stop at it. Pod A's two
    // containers share its 8 GiB: a1 takes 7 GiB (+300 MiB context), so a2 (+300 MiB) has
    // 424 MiB left, where alone it would have had 7.7 GiB.
    let state = SimState::new();
    let a1 = &cgroups.0[4];
    let a2 = &cgroups.0[5];
    let b1 = &cgroups.0[9];
    let mut la1 = Load::spawn_with_shim(
        a1,
        &state.0,
        &agent,
        &["info", "alloc", "7GiB", "alloc", "1GiB", "hold"],
    );
    la1.expect_line("ready");
    let mut la2 = Load::spawn_with_shim(
        a2,
        &state.0,
        &agent,
        &["alloc", "256MiB", "alloc", "256MiB", "hold"],
    );
    la2.expect_line("ready");
    let mut lb1 = Load::spawn_with_shim(
        b1,
        &state.0,
        &agent,
        &["info", "alloc", "3GiB", "alloc", "1GiB", "hold"],
    );
    lb1.expect_line("ready");
    let show = |l: &Load| l.lines.join(" | ");
    let allocs = |l: &Load| {
        l.lines
            .iter()
            .filter(|x| x.starts_with("alloc"))
            .cloned()
            .collect::<Vec<_>>()
    };
    let info = |l: &Load| {
        l.lines
            .iter()
            .find(|x| x.starts_with("info"))
            .cloned()
            .unwrap()
    };
    assert!(
        info(&la1).contains(&format!("total={}", 8 * GIB)),
        "{}",
        show(&la1)
    );
    assert!(
        info(&lb1).contains(&format!("total={}", 4 * GIB)),
        "{}",
        show(&lb1)
    );
    let (a1s, a2s, b1s) = (allocs(&la1), allocs(&la2), allocs(&lb1));
    assert!(
        a1s[0].starts_with("alloc ok") && a1s[1].contains("fail rc=2"),
        "{}",
        show(&la1)
    );
    assert!(
        a2s[0].starts_with("alloc ok") && a2s[1].contains("fail rc=2"),
        "one budget: {}",
        show(&la2)
    );
    assert!(
        b1s[0].starts_with("alloc ok") && b1s[1].contains("fail rc=2"),
        "{}",
        show(&lb1)
    );
    eprintln!(
        "pod A (8Gi/30%): {} ; {}\npod B (4Gi/70%): {}",
        show(&la1),
        show(&la2),
        show(&lb1)
    );

    // `fgpu status` names the pods (namespace/name from the claims) and the containers.
    let out = Command::new(env!("CARGO_BIN_EXE_fgpu"))
        .args(["status", "--json", "--socket"])
        .arg(&agent.admin)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for (cg, pod, ctr, uid) in [
        (&cgroups.0[4], "team-a/pod-a", "a1".repeat(32), POD_A),
        (&cgroups.0[9], "team-a/pod-b", "b1".repeat(32), POD_B),
    ] {
        let row = report
            .as_array()
            .unwrap_or_else(|| panic!("not an array of rows: {report}"))
            .iter()
            .find(|r| r["cgroup"] == cg.path.as_str())
            .unwrap_or_else(|| panic!("no row for {}: {report}", cg.path));
        assert_eq!(row["pod"], pod, "{row}");
        assert_eq!(row["container_id"], ctr.as_str(), "{row}");
        // As data too: the UID from the cgroup's name, the names the plugin sent.
        assert_eq!(row["pod_uid"], uid, "{row}");
        assert_eq!(row["pod_namespace"], "team-a", "{row}");
        assert_eq!(
            row["pod_name"],
            pod.strip_prefix("team-a/").unwrap(),
            "{row}"
        );
    }
    let table = Command::new(env!("CARGO_BIN_EXE_fgpu"))
        .args(["status", "--socket"])
        .arg(&agent.admin)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains(&format!("team-a/pod-a/{}", &"a1".repeat(32)[..12])),
        "{table}"
    );

    // A restart of the plugin: prepare again is answered from the checkpoint (the claims
    // are gone from the API server now), with the same ids, and changes no limit.
    plugin.stop();
    api.remove(&claim_path("a"));
    api.remove(&claim_path("b"));
    let plugin = Plugin::start(&dirs, &agent, &api, &format!("/{base}"));
    kdra.redial(&plugin.dra_sock);
    let again = rt.block_on(kubelet::prepare(&plugin.dra_sock, claims.clone()));
    assert_eq!(again, resp, "{}", plugin.log_text());
    // A 1.33 kubelet's call (the v1beta1 service) gets the same answer.
    let beta = rt.block_on(kubelet::prepare_v1beta1(&plugin.dra_sock, claims.clone()));
    assert_eq!(beta, resp, "over v1beta1\n{}", plugin.log_text());
    assert_eq!(
        limit_of(&agent, &a_cg),
        Some((Some(8 * GIB), Some(30))),
        "not doubled"
    );
    assert_eq!(limit_of(&agent, &b_cg), Some((Some(4 * GIB), Some(70))));

    // A claim the API server does not have is refused with a reason, the others untouched:
    // the kubelet does not start its pod, and calls the plugin again at the next try.
    let ghost = kubelet::claim("team-a", "ghost", "7d1e0c2a-3333-4c8e-9f00-00000000000c");
    for attempt in 1..=2 {
        let err = rt
            .block_on(kdra.prepare_pod(POD_GHOST, std::slice::from_ref(&ghost)))
            .unwrap_err();
        assert!(
            err.starts_with("NodePrepareResources failed for claim team-a/ghost: ")
                && err.contains("team-a/ghost")
                && err.contains("API server"),
            "{err}"
        );
        assert_eq!(kdra.prepare_calls, 2 + attempt);
    }
    assert_eq!(kdra.prepared(), [CLAIM_A, CLAIM_B]);
    assert_eq!(limit_of(&agent, &a_cg), Some((Some(8 * GIB), Some(30))));

    drop((la1, la2, lb1));
    // Pod C goes first: claim A is still pod A's, so the kubelet does not unprepare it.
    rt.block_on(kdra.unprepare_pod(POD_C)).unwrap();
    assert_eq!(kdra.unprepare_calls, 0);
    assert_eq!(limit_of(&agent, &a_cg), Some((Some(8 * GIB), Some(30))));
    // Then pods A and B: one call each, after which the claims are gone from the node.
    for pod in [POD_A, POD_B] {
        rt.block_on(kdra.unprepare_pod(pod))
            .unwrap_or_else(|e| panic!("{e}\n{}", plugin.log_text()));
    }
    assert_eq!(kdra.unprepare_calls, 2);
    assert!(kdra.prepared().is_empty());
    // Unprepare removes the limits and the CDI specs; again (over v1beta1), it is a no-op.
    for beta in [false, true] {
        let errors: std::collections::HashMap<String, String> = if beta {
            rt.block_on(kubelet::unprepare_v1beta1(&plugin.dra_sock, claims.clone()))
        } else {
            let un = rt.block_on(kubelet::unprepare(&plugin.dra_sock, claims.clone()));
            un.claims.into_iter().map(|(k, v)| (k, v.error)).collect()
        };
        for uid in [CLAIM_A, CLAIM_B] {
            assert_eq!(errors[uid], "", "{}", plugin.log_text());
            assert!(
                !dirs
                    .cdi()
                    .join(format!("fgpu.io-claim_{uid}.json"))
                    .exists()
            );
        }
        assert_eq!(limit_of(&agent, &a_cg), None, "{:?}", limits(&agent));
        assert_eq!(limit_of(&agent, &b_cg), None);
        assert_eq!(
            limit_of(&agent, &c_cg),
            None,
            "the sharer's limit goes with the claim"
        );
    }
    plugin.stop();
    drop(cgroups);
    let _ = std::fs::remove_dir_all(&dirs.root);
}

#[test]
fn device_plugin_registers_lists_units_and_allocates_cdi_devices_on_one_gpu() {
    use fgpu_kubelet_api::deviceplugin::v1beta1 as dp;
    let dir = std::env::temp_dir().join(unique("fgpu-dp"));
    std::fs::create_dir_all(&dir).unwrap();
    let sim_state = SimState::new();
    let rt = rt();
    rt.block_on(async {
        let registry = kubelet::DeviceRegistry::new(&dir);
        kubelet::serve_registry(&dir.join("kubelet.sock"), registry.clone());
        // Beside the directory: a kubelet that starts empties it.
        let log = dir.with_extension("log");
        let child = Command::new(env!("CARGO_BIN_EXE_fgpu"))
            .args([
                "kubelet-plugin",
                "--sim",
                "--device-plugin",
                "--memory-unit",
                "1GiB",
            ])
            .arg("--device-plugins-dir")
            .arg(&dir)
            .env("FGPU_SIM_DIR", sim_dir())
            .env("FGPU_SIM_DEVICES", "2")
            .env("FGPU_SIM_STATE", &sim_state.0)
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let _child = KillOnDrop(child);
        registered(&registry, &log, "no registrations").await;
        let regs = registry.regs.lock().unwrap().clone();
        let mut names: Vec<&str> = regs.iter().map(|r| r.resource_name.as_str()).collect();
        names.sort();
        assert_eq!(names, ["fgpu.io/gpu-compute", "fgpu.io/gpu-memory"]);
        for r in &regs {
            assert_eq!(r.version, "v1beta1");
            assert!(
                r.options
                    .as_ref()
                    .unwrap()
                    .get_preferred_allocation_available
            );
        }
        let mem = regs
            .iter()
            .find(|r| r.resource_name.ends_with("memory"))
            .unwrap();
        let mut c = dp::device_plugin_client::DevicePluginClient::new(
            kubelet::channel(&dir.join(&mem.endpoint)).await,
        );
        let mut stream = c.list_and_watch(dp::Empty {}).await.unwrap().into_inner();
        let first = stream.message().await.unwrap().unwrap();
        assert_eq!(first.devices.len(), 32, "16 GiB units on each of two GPUs");
        assert!(first.devices.iter().all(|d| d.health == "Healthy"));
        let ids: Vec<String> = first.devices.iter().map(|d| d.id.clone()).collect();
        let pref = c
            .get_preferred_allocation(dp::PreferredAllocationRequest {
                container_requests: vec![dp::ContainerPreferredAllocationRequest {
                    available_device_i_ds: ids[10..].to_vec(),
                    must_include_device_i_ds: vec![],
                    allocation_size: 8,
                }],
            })
            .await
            .unwrap()
            .into_inner();
        let chosen = &pref.container_responses[0].device_i_ds;
        assert_eq!(chosen.len(), 8);
        assert!(
            chosen.iter().all(|id| id.starts_with("gpu1-")),
            "the GPU with most free: {chosen:?}"
        );
        let alloc = c
            .allocate(dp::AllocateRequest {
                container_requests: vec![dp::ContainerAllocateRequest {
                    devices_ids: chosen.clone(),
                }],
            })
            .await
            .unwrap()
            .into_inner();
        let a = &alloc.container_responses[0];
        assert_eq!(a.envs["FGPU_MEMORY_LIMIT"], (8 * GIB).to_string());
        // The GPU, and the grant the CDI hook reads (what the container may ask).
        assert_eq!(a.cdi_devices.len(), 2);
        assert_eq!(a.cdi_devices[1].name, "fgpu.io/gpu=device-plugin-memory");
        assert!(
            a.cdi_devices[0].name.starts_with("fgpu.io/gpu=GPU-"),
            "{:?}",
            a.cdi_devices
        );
        let span = c
            .allocate(dp::AllocateRequest {
                container_requests: vec![dp::ContainerAllocateRequest {
                    devices_ids: vec!["gpu0-m0".into(), "gpu1-m0".into()],
                }],
            })
            .await
            .unwrap_err();
        assert_eq!(span.code(), tonic::Code::InvalidArgument);
        assert!(span.message().contains("span GPUs"), "{}", span.message());
        let comp = regs
            .iter()
            .find(|r| r.resource_name.ends_with("compute"))
            .unwrap();
        let mut c = dp::device_plugin_client::DevicePluginClient::new(
            kubelet::channel(&dir.join(&comp.endpoint)).await,
        );
        let a = c
            .allocate(dp::AllocateRequest {
                container_requests: vec![dp::ContainerAllocateRequest {
                    devices_ids: (0..30).map(|k| format!("gpu0-c{k}")).collect(),
                }],
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(a.container_responses[0].envs["FGPU_COMPUTE_SHARE"], "30");
        assert_eq!(
            a.container_responses[0].cdi_devices[1].name,
            "fgpu.io/gpu=device-plugin-compute"
        );

        // The kubelet restarts: its device manager deletes every socket in the directory
        // and takes registrations on a new kubelet.sock, dialling each plugin's endpoint.
        // fgpu serves on new sockets and registers both resources again.
        kubelet::restart_device_manager(&dir, &registry);
        registered(
            &registry,
            &log,
            "not registered again after a kubelet restart",
        )
        .await;
        let mem = registry
            .regs
            .lock()
            .unwrap()
            .iter()
            .find(|r| r.resource_name.ends_with("memory"))
            .cloned()
            .unwrap();
        let mut c = dp::device_plugin_client::DevicePluginClient::new(
            kubelet::channel(&dir.join(&mem.endpoint)).await,
        );
        let mut stream = c.list_and_watch(dp::Empty {}).await.unwrap().into_inner();
        let again = stream.message().await.unwrap().unwrap();
        assert_eq!(again.devices.len(), 32, "the same units after the restart");
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits (20 s at most) until both resources registered with `registry`.
async fn registered(registry: &kubelet::DeviceRegistry, log: &Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while registry.regs.lock().unwrap().len() < 2 {
        assert!(
            Instant::now() < deadline,
            "{what}: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The applied ResourceSlice passes `kubernetes-validate --strict` against 1.34, 1.35, 1.36 and 1.37,
/// where the tool is installed (deploy/helm/fetch-tools.sh; fgpu-agent/tests/helm_chart.rs
/// requires it in CI).
fn validate_slice(body: &str) {
    let tool = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/opt/fgpu-k8s-tools")])
        .map(|d| d.join("kubernetes-validate"))
        .find(|p| p.is_file());
    let Some(tool) = tool else {
        eprintln!("SKIPPED: the slice's schema check (kubernetes-validate not installed)");
        return;
    };
    let file = std::env::temp_dir()
        .join(unique("fgpu-slice"))
        .with_extension("json");
    std::fs::write(&file, body).unwrap();
    for v in ["1.34.0", "1.35.0", "1.36.0", "1.37.0"] {
        let out = Command::new(&tool)
            .args(["--strict", "-k", v])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the ResourceSlice fails {v}'s schema: {}{}\n{body}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = std::fs::remove_file(&file);
}
