//! End-to-end (issue 26, breaks 2 and 3): the node's ResourceSlice as a real API server and
//! kubelet treat it. The stand-in API server validates a slice before it stores it with the
//! rules of kubernetes/kubernetes `pkg/apis/resource/validation` (`k8s::validate`), and
//! refuses what fgpu used to write for an H200 (a default memory of the raw 143771 MiB, not
//! a multiple of the 256 MiB step) with the upstream message. `fgpu kubelet-plugin` on
//! simulated GPUs of 143771 MiB (H200), 81559 MiB (80 GB), 24564 MiB (24 GB) and 16 GiB
//! publishes a slice it stores, after a first publish that failed twice (retried, not given
//! up), and — on the H200 — publishes it again after the kubelet deleted it, as a kubelet
//! does when it starts (pkg/kubelet/cm/dra/plugin: the node's slices are wiped at start and
//! 30 s after a plugin unregisters). An API server with DRAConsumableCapacity off stores the
//! slice without its sharing fields: the plugin says so.

mod common;
mod k8s;

use std::time::{Duration, Instant};

use common::{Agent, SimState, privileged, unique};
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
            api.remove(SLICE);
            wait_for(
                "the slice was not published again after the kubelet deleted it",
                &plugin,
                || api.get(SLICE).is_some(),
            );
            assert!(
                plugin.log_text().contains("publishing it again"),
                "{}",
                plugin.log_text()
            );
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
