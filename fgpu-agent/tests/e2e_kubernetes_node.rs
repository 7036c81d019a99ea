//! End-to-end (issue 26, breaks 2 and 3): the node's ResourceSlice as a real API server and
//! kubelet treat it. The stand-in API server validates a slice before it stores it with the
//! rules of kubernetes/kubernetes `pkg/apis/resource/validation` (`k8s::validate`), and
//! refuses what fgpu used to write for an H200 (a default memory of the raw 143771 MiB, not
//! a multiple of the 256 MiB step) with the upstream message. `fgpu kubelet-plugin` on
//! simulated GPUs of 143771 MiB (H200), 81559 MiB (80 GB), 24564 MiB (24 GB) and 16 GiB
//! publishes a slice it stores, after a first publish that failed twice (retried, not given
//! up), and — on the H200 — publishes it again after the kubelet deleted it, as a kubelet
//! does when it starts (pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go: the node's slices are
//! wiped at start, by `fgpu_kubelet_api::stand_in::resource_slices`, and 30 s after a plugin
//! unregisters). An API server with DRAConsumableCapacity off stores the slice without its
//! sharing fields: the plugin says so. `fgpu-test-kubelet restart`, run against a running
//! plugin, wipes the node's slices (every driver's, no other node's), re-registers the plugin
//! and empties the device-plugins directory of its sockets but for the checkpoint.

mod common;
mod k8s;

use std::time::{Duration, Instant};

use common::{Agent, SimState, privileged, unique};
use fgpu_kubelet_api::stand_in::{device_manager, resource_slices};
use k8s::apiserver::ApiServer;
use k8s::plugin::{Plugin, PluginDirs};
use k8s::validate;

const MIB: u64 = 1 << 20;
const SLICE: &str = "/apis/resource.k8s.io/v1/resourceslices/node-1-fgpu.io";

/// The memory capacity fgpu wrote before for a GPU of `total` bytes: its default the raw
/// total.
fn old_slice(total: u64) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "node-1-fgpu.io"},
        "spec": {"driver": "fgpu.io", "nodeName": "node-1",
            "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "allowMultipleAllocations": true,
                "capacity": {"memory": {"value": total.to_string(), "requestPolicy": {
                    "default": total.to_string(),
                    "validRange": {"min": "256Mi", "step": "256Mi"}}}}}]}
    })
}

/// The plugin found its slice gone (`when`) and published it again, saying so.
fn republished(when: &str, plugin: &Plugin, api: &ApiServer) {
    wait_for(
        &format!("the slice was not published again {when}"),
        plugin,
        || api.get(SLICE).is_some(),
    );
    assert!(
        plugin.log_text().contains("publishing it again"),
        "{}",
        plugin.log_text()
    );
}

fn wait_for(what: &str, plugin: &Plugin, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !done() {
        assert!(Instant::now() < deadline, "{what}:\n{}", plugin.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_h200_slice_as_fgpu_wrote_it_before_is_refused_with_the_upstream_message() {
    let errs = validate::resource_slice(&old_slice(143_771 * MIB));
    assert_eq!(
        errs,
        [
            "spec.devices[0].capacity[memory].requestPolicy.validRange.step: Invalid value: \
             \"150754820096\": value is not a multiple of a given step (256Mi) from (256Mi)"
        ],
    );
    // A 16 GiB GPU's was valid (a multiple of 256 MiB), which is why the tests never saw it.
    assert!(validate::resource_slice(&old_slice(16 << 30)).is_empty());
}

#[test]
fn privileged_the_slice_is_valid_on_every_gpu_size_retried_and_published_again_after_a_kubelet_restart()
 {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    for (gpu, mib) in [
        ("H200", 143_771u64),
        ("80 GB", 81_559),
        ("24 GB", 24_564),
        ("16 GiB", 16_384),
    ] {
        let api = ApiServer::start();
        api.put(
            "/api/v1/nodes/node-1",
            r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"node-1","uid":"11111111-2222-3333-4444-555555555555"}}"#,
        );
        // The API server is not ready for the first two publishes.
        api.fail_patches(2);
        let dirs = PluginDirs {
            root: std::env::temp_dir().join(unique("fgpu-k8s-node")),
        };
        std::fs::create_dir_all(&dirs.root).unwrap();
        let state = SimState::new();
        let memory = format!("FGPU_SIM_MEMORY={mib}MiB");
        let state_env = format!("FGPU_SIM_STATE={}", state.0.display());
        let plugin = Plugin::start_via(
            &["env", &memory, &state_env],
            &dirs,
            &agent,
            &api,
            "/",
            &["--slice-recheck", "1"],
        );
        wait_for(
            &format!("{gpu}: no slice stored after two failed publishes"),
            &plugin,
            || api.get(SLICE).is_some(),
        );
        assert_eq!(api.refused(), [] as [(String, String); 0], "{gpu}");
        let slice: serde_json::Value = serde_json::from_str(&api.get(SLICE).unwrap()).unwrap();
        let memory = &slice["spec"]["devices"][0]["capacity"]["memory"];
        assert_eq!(memory["value"], (mib * MIB).to_string(), "{gpu}");
        let default = mib / 256 * 256 * MIB;
        assert_eq!(
            memory["requestPolicy"]["default"],
            default.to_string(),
            "{gpu}: whole 256 MiB steps of the GPU"
        );
        assert!(
            plugin.log_text().contains("retry_in_s"),
            "{gpu}: the failed publishes are said, with when they are retried:\n{}",
            plugin.log_text()
        );
        if gpu == "H200" {
            // The kubelet starts and wipes the node's slices: fgpu publishes it again.
            let wiped = resource_slices::wipe_resource_slices(&api.url, "node-1", 1).unwrap();
            assert_eq!(wiped.deleted, ["node-1-fgpu.io"]);
            republished("after the kubelet deleted it", &plugin, &api);
        }
        if gpu == "24 GB" {
            // An API server with DRAConsumableCapacity off drops the sharing fields on
            // write, silently: the plugin reads the slice back and says so, once.
            api.without_consumable_capacity();
            api.remove(SLICE);
            wait_for(
                "no error about the dropped consumable-capacity fields",
                &plugin,
                || {
                    plugin
                        .log_text()
                        .contains("DRAConsumableCapacity feature gate is off")
                },
            );
        }
        plugin.stop();
        let _ = std::fs::remove_dir_all(&dirs.root);
    }
}

/// The `fgpu-test-kubelet` binary, built next to `fgpu` by `cargo xtask test`.
fn test_kubelet() -> std::path::PathBuf {
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_fgpu")).with_file_name("fgpu-test-kubelet");
    assert!(
        exe.is_file(),
        "{} is not built: run `cargo xtask test` (or `cargo build -p fgpu-kubelet-api`)",
        exe.display()
    );
    exe
}

#[test]
fn privileged_fgpu_test_kubelet_restart_wipes_the_slices_re_registers_and_empties_the_device_plugins_dir()
 {
    if !privileged() {
        return;
    }
    let kubelet = test_kubelet();
    let agent = Agent::start();
    let api = ApiServer::start();
    api.put(
        "/api/v1/nodes/node-1",
        r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"node-1","uid":"11111111-2222-3333-4444-555555555555"}}"#,
    );
    // Another driver's slice of this node goes too; another node's stays.
    let slice = |name: &str, node: &str, driver: &str| {
        let path = format!("/apis/resource.k8s.io/v1/resourceslices/{name}");
        let body = serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name}, "spec": {"driver": driver, "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}});
        api.put(&path, &body.to_string());
        path
    };
    let other_driver = slice("node-1-gpu.example.com", "node-1", "gpu.example.com");
    let other_node = slice("node-2-fgpu.io", "node-2", "fgpu.io");
    let dirs = PluginDirs {
        root: std::env::temp_dir().join(unique("fgpu-k8s-restart")),
    };
    let device_plugins = dirs.root.join("device-plugins");
    std::fs::create_dir_all(&device_plugins).unwrap();
    // A device plugin's socket and the device manager's checkpoint.
    let dp_sock = device_plugins.join("fgpu.io-memory.sock");
    let _dp = std::os::unix::net::UnixListener::bind(&dp_sock).unwrap();
    let checkpoint = device_plugins.join(device_manager::CHECKPOINT);
    std::fs::write(&checkpoint, "{}").unwrap();
    let plugin = Plugin::start_via(&[], &dirs, &agent, &api, "/", &["--slice-recheck", "1"]);
    wait_for("no slice published", &plugin, || api.get(SLICE).is_some());

    let out = std::process::Command::new(&kubelet)
        .arg("restart")
        .arg("--device-plugins-dir")
        .arg(&device_plugins)
        .arg("--registry-dir")
        .arg(dirs.root.join("plugins_registry"))
        .args(["--api-server", &api.url, "--node", "node-1"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let line = |key: &str| {
        lines
            .iter()
            .find(|l| l.get(key).is_some())
            .unwrap_or_else(|| panic!("no {key} line: {stdout}"))
    };
    assert_eq!(line("removed")["removed"], dp_sock.display().to_string());
    assert!(!dp_sock.exists(), "the device plugin's socket is removed");
    assert!(checkpoint.is_file(), "the checkpoint stays");
    let mut deleted: Vec<_> = line("deleted_slices")["deleted_slices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect();
    deleted.sort();
    assert_eq!(
        deleted,
        ["node-1-fgpu.io", "node-1-gpu.example.com"],
        "{stdout}"
    );
    assert_eq!(
        api.deletes(),
        ["/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dnode-1"]
    );
    assert!(api.get(&other_driver).is_none());
    assert!(api.get(&other_node).is_some(), "another node's slice stays");
    let reg = line("registered");
    assert_eq!(reg["registered"], true, "{stdout}");
    assert_eq!(reg["name"], "fgpu.io");
    assert_eq!(reg["socket"], plugin.reg_sock.display().to_string());
    assert_eq!(reg["service"], fgpu_kubelet_api::DRA_V1_VERSION);
    // The plugin heard the new registration, and publishes its slice again.
    wait_for("the plugin was not told it is registered", &plugin, || {
        plugin.log_text().contains("registered with the kubelet")
    });
    republished("after the restart", &plugin, &api);
    plugin.stop();
    let _ = std::fs::remove_dir_all(&dirs.root);
}
