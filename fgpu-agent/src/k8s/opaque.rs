//! A prepared claim's opaque configuration for fgpu (`status.allocation.devices.config`):
//! what it may say (`parkAfter`, docs/kubernetes.md "Parking") and which entries count.

use anyhow::{Result, bail};
use k8s_openapi::api::resource::v1::DeviceAllocationConfiguration;

/// The one key of fgpu's opaque parameters.
pub const PARK_AFTER: &str = "parkAfter";

/// The `parkAfter` (ms) that the allocation's configuration gives the results `result_refs`
/// (`request` of each allocation result of this driver: `gpu`, or `gpu/small` for a
/// prioritized list's subrequest). `configs` is `status.allocation.devices.config`, into
/// which the scheduler copies the DeviceClass's `spec.config` (source `FromClass`) and the
/// claim's `spec.devices.config` (source `FromClaim`): resource.k8s.io/v1,
/// `DeviceAllocationResult.Config []DeviceAllocationConfiguration` (`source`, `requests`,
/// and the inlined `DeviceConfiguration`'s `opaque: {driver, parameters}`), read in
/// kubernetes/api resource/v1/types.go at release-1.34 (f40c031f) and master (10b39a39,
/// 1.37 beta); v1beta1 and v1beta2 have the same fields, and the plugin reads claims as v1
/// whatever version they were written in (the API server converts).
///
/// Which entries count, as upstream drivers decide: an entry whose `opaque.driver` is
/// another driver's is ignored, and one without `opaque` names no driver; one whose
/// `requests` is non-empty applies only if it names a result's request, or the main request
/// of a subrequest result (`ConfigForResult`, k8s.io/dynamic-resource-allocation/
/// resourceclaim). Of those, class entries come first and claim entries after, each in list
/// order, and the last that sets `parkAfter` wins: a claim's configuration overrides its
/// class's (`GetOpaqueDeviceConfigs`, "in order of reverse precedence", in
/// kubernetes-sigs/dra-example-driver cmd/dra-example-kubeletplugin/state.go at 31914ce,
/// which also refuses an unknown `source`). Every entry of ours that applies is checked,
/// overridden or not: `parameters` must be a JSON object whose only key is `parkAfter`, a
/// duration string (`30s`, `500ms`, `2m`, `1h`, whole seconds) above 0.
pub fn park_after(
    configs: &[DeviceAllocationConfiguration],
    driver: &str,
    result_refs: &[&str],
) -> Result<Option<u64>> {
    let applies = |c: &DeviceAllocationConfiguration| match c.requests.as_deref() {
        None | Some([]) => true,
        Some(names) => result_refs.iter().any(|r| {
            let base = r.split('/').next().unwrap_or_default();
            names.iter().any(|n| n == r || n == base)
        }),
    };
    let mut ours: Vec<(u8, usize, &DeviceAllocationConfiguration)> = Vec::new();
    for (i, c) in configs.iter().enumerate() {
        let Some(opaque) = c.opaque.as_ref() else {
            continue;
        };
        if opaque.driver != driver || !applies(c) {
            continue;
        }
        let rank = match c.source.as_str() {
            "FromClass" => 0,
            "FromClaim" => 1,
            other => bail!(
                "status.allocation.devices.config[{i}].source is {other:?}, neither FromClass \
                 nor FromClaim"
            ),
        };
        ours.push((rank, i, c));
    }
    // Stable: list order within each source.
    ours.sort_by_key(|(rank, i, _)| (*rank, *i));
    let mut found = None;
    for (_, i, c) in ours {
        let from = if c.source == "FromClass" {
            "from the DeviceClass's spec.config"
        } else {
            "from the claim's spec.devices.config"
        };
        let at = format!("status.allocation.devices.config[{i}] ({from}) opaque.parameters");
        let params = c.opaque.as_ref().map(|o| &o.parameters.0);
        let Some(serde_json::Value::Object(map)) = params else {
            bail!(
                "{at}: fgpu's parameters are a JSON object ({{\"{PARK_AFTER}\": \"30s\"}}), \
                 not {}",
                params.map(|p| p.to_string()).unwrap_or_default()
            );
        };
        if let Some(key) = map.keys().find(|k| k.as_str() != PARK_AFTER) {
            bail!("{at}: unknown key {key:?} ({driver} knows only {PARK_AFTER:?})");
        }
        let Some(v) = map.get(PARK_AFTER) else {
            continue;
        };
        let serde_json::Value::String(text) = v else {
            bail!("{at}.{PARK_AFTER}: {v} is not a duration string such as \"30s\"");
        };
        let ms = fgpu_common::quantity::parse_duration_ms(text)
            .map_err(|e| anyhow::anyhow!("{at}.{PARK_AFTER}: {text:?}: {e}"))?;
        if ms == 0 {
            bail!(
                "{at}.{PARK_AFTER}: {text:?}: 0 would park the pod the moment it pauses; give \
                 how long it must leave the GPU alone first, e.g. \"30s\""
            );
        }
        found = Some(ms);
    }
    Ok(found)
}
