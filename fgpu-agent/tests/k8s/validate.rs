//! What the API server checks in a ResourceSlice before it stores it, for the fields fgpu
//! writes: the rules of kubernetes/kubernetes `pkg/apis/resource/validation/validation.go`
//! (`ValidateResourceSlice`, `validateDevice`, `validateMultiAllocatableDeviceCapacity`,
//! `validateRequestPolicy`, `validateRequestPolicyRange(Step)`,
//! `validateRequestPolicyValidValues`; 1.34-1.35), re-stated here, with the upstream
//! messages (`field.Invalid` and friends print as `PATH: Invalid value: "V": MSG`). Not
//! checked: CEL, counters, taints, binding conditions, and every field fgpu never sets.

use serde_json::Value;

/// `resource.ResourceSliceMaxDevices` (1.34).
const MAX_DEVICES: usize = 128;
/// `resource.CapacityRequestPolicyDiscreteMaxOptions`.
const MAX_VALID_VALUES: usize = 10;
/// `resource.PoolNameMaxLength`.
const POOL_NAME_MAX: usize = 253;

/// The upstream messages of every rule `slice` breaks (empty: stored).
pub fn resource_slice(slice: &Value) -> Vec<String> {
    let mut errs = Vec::new();
    let name = slice["metadata"]["name"].as_str().unwrap_or("");
    if name.is_empty() {
        errs.push("metadata.name: Required value: name or generateName is required".into());
    } else if !dns_subdomain(name) {
        errs.push(invalid("metadata.name", name, DNS_SUBDOMAIN_MSG));
    }
    let spec = &slice["spec"];
    let driver = spec["driver"].as_str().unwrap_or("");
    if driver.is_empty() {
        errs.push("spec.driver: Required value".into());
    } else if driver.len() > 63 || !dns_subdomain(driver) {
        errs.push(invalid("spec.driver", driver, DNS_SUBDOMAIN_MSG));
    }
    let pool = &spec["pool"];
    match pool["name"].as_str().unwrap_or("") {
        "" => errs.push("spec.pool.name: Required value".into()),
        p if p.len() > POOL_NAME_MAX => errs.push(format!(
            "spec.pool.name: Too long: may not be more than {POOL_NAME_MAX} bytes"
        )),
        p if !p.split('/').all(dns_subdomain) => {
            errs.push(invalid("spec.pool.name", p, DNS_SUBDOMAIN_MSG))
        }
        _ => {}
    }
    if pool["generation"].as_i64().unwrap_or(-1) < 0 {
        errs.push(invalid(
            "spec.pool.generation",
            &pool["generation"].to_string(),
            "must be greater than or equal to 0",
        ));
    }
    if pool["resourceSliceCount"].as_i64().unwrap_or(0) <= 0 {
        errs.push(invalid(
            "spec.pool.resourceSliceCount",
            &pool["resourceSliceCount"].to_string(),
            "must be greater than 0",
        ));
    }
    let devices = spec["devices"].as_array().cloned().unwrap_or_default();
    if devices.len() > MAX_DEVICES {
        errs.push(format!(
            "spec.devices: Too many: {}: must have at most {MAX_DEVICES} items",
            devices.len()
        ));
        return errs;
    }
    let mut seen = std::collections::HashSet::new();
    for (i, d) in devices.iter().enumerate() {
        let path = format!("spec.devices[{i}]");
        let dname = d["name"].as_str().unwrap_or("");
        if !dns_label(dname) {
            errs.push(invalid(&format!("{path}.name"), dname, DNS_LABEL_MSG));
        }
        if !seen.insert(dname.to_string()) {
            errs.push(format!("{path}.name: Duplicate value: \"{dname}\""));
        }
        let multiple = d["allowMultipleAllocations"].as_bool().unwrap_or(false);
        let Some(caps) = d["capacity"].as_object() else {
            continue;
        };
        for (key, cap) in caps {
            let cpath = format!("{path}.capacity[{key}]");
            let Some(value) = q(&cap["value"]) else {
                errs.push(format!("{cpath}.value: Required value"));
                continue;
            };
            if cap["requestPolicy"].is_null() {
                continue;
            }
            if !multiple {
                errs.push(format!(
                    "{cpath}.requestPolicy: Forbidden: allowMultipleAllocations must be true"
                ));
                continue;
            }
            request_policy(
                &mut errs,
                &format!("{cpath}.requestPolicy"),
                value,
                &cap["requestPolicy"],
            );
        }
    }
    errs
}

fn request_policy(errs: &mut Vec<String>, path: &str, capacity: Q<'_>, p: &Value) {
    let default = q(&p["default"]);
    let values = p["validValues"].as_array().filter(|v| !v.is_empty());
    let range = p.get("validRange").filter(|r| !r.is_null());
    match (values, range) {
        (Some(_), Some(_)) => errs.push(format!(
            "{path}: Forbidden: exactly one policy can be specified, cannot specify \
             \"validValues\" and \"validRange\" at the same time"
        )),
        (Some(values), None) => {
            let Some(default) = default else {
                errs.push(format!(
                    "{path}.default: Required value: required when validValues is defined"
                ));
                return;
            };
            let vpath = format!("{path}.validValues");
            if values.len() > MAX_VALID_VALUES {
                errs.push(format!(
                    "{vpath}: Too many: {}: must have at most {MAX_VALID_VALUES} items",
                    values.len()
                ));
                return;
            }
            let qs: Vec<Q<'_>> = values.iter().filter_map(q).collect();
            for i in 1..qs.len() {
                if qs[i - 1].v > qs[i].v {
                    errs.push(invalid(
                        &format!("{vpath}[{i}]"),
                        qs[i].s,
                        "values must be sorted in ascending order",
                    ));
                }
            }
            for (i, v) in qs.iter().enumerate() {
                if v.v > capacity.v {
                    errs.push(invalid(
                        &format!("{vpath}[{i}]"),
                        v.s,
                        &format!("option is larger than capacity value: {}", capacity.s),
                    ));
                }
            }
            if !qs.iter().any(|v| v.v == default.v) {
                errs.push(invalid(
                    &vpath,
                    default.s,
                    "default value is not valid according to the requestPolicy",
                ));
            }
        }
        (None, Some(r)) => {
            let Some(default) = default else {
                errs.push(format!(
                    "{path}.default: Required value: required when validRange is defined"
                ));
                return;
            };
            let rpath = format!("{path}.validRange");
            let Some(min) = q(&r["min"]) else {
                errs.push(format!(
                    "{rpath}.min: Required value: required when validRange is defined"
                ));
                return;
            };
            let cap = capacity.s;
            if min.v > capacity.v {
                errs.push(invalid(
                    &format!("{rpath}.min"),
                    min.s,
                    &format!("min is larger than capacity value: {cap}"),
                ));
            }
            if default.v < min.v {
                errs.push(invalid(
                    &format!("{rpath}.min"),
                    default.s,
                    &format!("default is less than min: {}", min.s),
                ));
            }
            let max = q(&r["max"]);
            if let Some(max) = max {
                if min.v > max.v {
                    errs.push(invalid(
                        &format!("{rpath}.max"),
                        min.s,
                        &format!("min is larger than max: {}", max.s),
                    ));
                }
                if max.v > capacity.v {
                    errs.push(invalid(
                        &format!("{rpath}.max"),
                        max.s,
                        &format!("max is larger than capacity value: {cap}"),
                    ));
                }
                if default.v > max.v {
                    errs.push(invalid(
                        &format!("{rpath}.max"),
                        default.s,
                        &format!("default is more than max: {}", max.s),
                    ));
                }
            }
            if let Some(step) = q(&r["step"]).filter(|s| s.v > 0) {
                if min.v + step.v > capacity.v {
                    errs.push(invalid(
                        &format!("{rpath}.step"),
                        step.s,
                        &format!(
                            "one step {} is larger than capacity value: {cap}",
                            min.v + step.v
                        ),
                    ));
                }
                for v in std::iter::once(default).chain(max) {
                    if (v.v - min.v) % step.v != 0 {
                        errs.push(invalid(
                            &format!("{rpath}.step"),
                            v.s,
                            &format!(
                                "value is not a multiple of a given step ({}) from ({})",
                                step.s, min.s
                            ),
                        ));
                    }
                }
            }
        }
        (None, None) => {}
    }
}

fn invalid(path: &str, value: &str, msg: &str) -> String {
    format!("{path}: Invalid value: \"{value}\": {msg}")
}

const DNS_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric \
                             characters or '-', and must start and end with an alphanumeric \
                             character";
const DNS_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case \
                                 alphanumeric characters, '-' or '.', and must start and end \
                                 with an alphanumeric character";

fn dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

fn dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(dns_label)
}

/// A quantity: its value, and its text as the API server prints it back (upstream's
/// messages show `Quantity.String()`, which keeps the format it was written in).
#[derive(Clone, Copy)]
struct Q<'a> {
    v: i128,
    s: &'a str,
}

fn q(v: &Value) -> Option<Q<'_>> {
    let s = v.as_str()?;
    Some(Q { v: quantity(s)?, s })
}

/// A Kubernetes quantity as an integer (binary and decimal suffixes; no fractions, which
/// fgpu never writes).
pub fn quantity(s: &str) -> Option<i128> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, suffix) = s.split_at(split);
    let n: i128 = n.parse().ok()?;
    let m: i128 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return None,
    };
    Some(n * m)
}
