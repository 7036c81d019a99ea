//! The metric families: one [`Sample`] of the agent's state encoded with `prometheus-client`
//! (a [`Collector`] that writes every family from the sample, so that a cgroup that is gone
//! from the sample has no series any more).
//!
//! Names, types and labels are documented in docs/observability.md; keep the two in step.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::collections::BTreeMap;

use super::labels;
use crate::agent::gpus::Gpu;
use crate::status::{CgroupStatus, StatusReport};

/// Every name starts with this.
pub const PREFIX: &str = "fgpu";

/// Most cgroups exported in one scrape (the rest are counted in
/// `fgpu_metrics_cgroups_omitted`): cardinality stays bounded whatever the node runs.
pub const MAX_CGROUPS: usize = 4096;

/// One device record of a ledger whose compute is gated.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerDevice {
    /// The ledger's cgroup (a limited cgroup whose budget its subtree shares).
    pub ledger: String,
    /// NVML index of the device.
    pub gpu: u32,
    /// Turns granted by the compute controller (the turn word's grant count).
    pub turns: u64,
    /// GPU time the ledger's shims measured on the device, seconds.
    pub gpu_time_s: f64,
}

/// What one scrape exports: the status report (the same one `fgpu status --json` prints)
/// and the node's figures besides it.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub hostname: String,
    pub report: StatusReport,
    pub gpus: Vec<Gpu>,
    pub ledgers: usize,
    pub shims: usize,
    pub ledger_devices: Vec<LedgerDevice>,
    /// Turn switches per GPU (NVML index): the time the device went without a holder.
    pub switches: Vec<(u32, Histogram)>,
    pub ready: bool,
}

/// The registry of one scrape.
pub fn registry(sample: Sample) -> Registry {
    let mut registry = Registry::with_prefix(PREFIX);
    registry.register_collector(Box::new(SampleCollector(sample)));
    registry
}

/// The OpenMetrics text of one sample.
pub fn encode(sample: Sample) -> String {
    let mut body = String::new();
    // Writing into a String cannot fail; an error here would be a bug of the encoder.
    if let Err(err) = prometheus_client::encoding::text::encode(&mut body, &registry(sample)) {
        tracing::error!("encoding the metrics failed: {err}");
    }
    body
}

#[derive(Debug)]
struct SampleCollector(Sample);

type Labels = Vec<(&'static str, String)>;

/// One family: its descriptor, then one series per label set.
struct Family<'a> {
    name: &'a str,
    help: &'a str,
    unit: Option<Unit>,
}

impl Family<'_> {
    fn gauges(
        &self,
        enc: &mut DescriptorEncoder<'_>,
        series: impl IntoIterator<Item = (Labels, f64)>,
    ) -> std::fmt::Result {
        let mut m =
            enc.encode_descriptor(self.name, self.help, self.unit.as_ref(), MetricType::Gauge)?;
        for (labels, v) in series {
            ConstGauge::new(v).encode(m.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn counters(
        &self,
        enc: &mut DescriptorEncoder<'_>,
        series: impl IntoIterator<Item = (Labels, f64)>,
    ) -> std::fmt::Result {
        let mut m = enc.encode_descriptor(
            self.name,
            self.help,
            self.unit.as_ref(),
            MetricType::Counter,
        )?;
        for (labels, v) in series {
            ConstCounter::new(v).encode(m.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

const fn fam<'a>(name: &'a str, help: &'a str) -> Family<'a> {
    Family {
        name,
        help,
        unit: None,
    }
}

fn bytes<'a>(name: &'a str, help: &'a str) -> Family<'a> {
    Family {
        name,
        help,
        unit: Some(Unit::Bytes),
    }
}

fn seconds<'a>(name: &'a str, help: &'a str) -> Family<'a> {
    Family {
        name,
        help,
        unit: Some(Unit::Seconds),
    }
}

impl SampleCollector {
    fn host(&self) -> Labels {
        vec![("Hostname", labels::value(&self.0.hostname))]
    }

    /// A cgroup's labels: its path, what the path says about its container, the node.
    fn cgroup(&self, path: &str) -> Labels {
        let c = labels::parse(path);
        let mut l: Labels = vec![("cgroup", labels::value(path))];
        if let Some(id) = c.container_id {
            l.push(("container_id", id));
        }
        if let Some(uid) = c.pod_uid {
            l.push(("pod_uid", uid));
        }
        l.push(("Hostname", labels::value(&self.0.hostname)));
        l
    }

    /// A device's labels as DCGM's exporter writes them (`gpu` index, `UUID`).
    fn gpu(&self, index: u32) -> Labels {
        let uuid = self
            .0
            .gpus
            .iter()
            .find(|g| g.index == index)
            .map_or_else(String::new, |g| labels::value(&g.uuid));
        vec![("gpu", index.to_string()), ("UUID", uuid)]
    }

    fn rows(&self) -> &[CgroupStatus] {
        let rows = &self.0.report.cgroups;
        &rows[..rows.len().min(MAX_CGROUPS)]
    }

    fn per_cgroup(&self, f: impl Fn(&CgroupStatus) -> Option<f64>) -> Vec<(Labels, f64)> {
        self.rows()
            .iter()
            .filter_map(|r| f(r).map(|v| (self.cgroup(&r.cgroup), v)))
            .collect()
    }

    /// A compute setting as a ratio: one series per cgroup, or with per-GPU values one per
    /// GPU of the node (gpu and UUID labels; the plain value on GPUs without their own).
    fn per_gpu_compute(
        &self,
        pick: impl Fn(&CgroupStatus) -> (&BTreeMap<String, u8>, Option<u8>),
    ) -> Vec<(Labels, f64)> {
        let ratio = |p: u8| f64::from(p) / 100.0;
        self.rows()
            .iter()
            .flat_map(|r| -> Vec<(Labels, f64)> {
                let (per_gpu, plain) = pick(r);
                if per_gpu.is_empty() {
                    return plain
                        .map(|p| (self.cgroup(&r.cgroup), ratio(p)))
                        .into_iter()
                        .collect();
                }
                self.0
                    .gpus
                    .iter()
                    .filter_map(|g| {
                        let p = per_gpu.get(&g.uuid).copied().or(plain)?;
                        let mut l = self.cgroup(&r.cgroup);
                        l.extend(self.gpu(g.index));
                        Some((l, ratio(p)))
                    })
                    .collect()
            })
            .collect()
    }

    fn encode_cgroups(&self, enc: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        bytes(
            "cgroup_memory_used",
            "GPU memory the kernel saw allocated by the cgroup's own processes and not freed, per device",
        )
        .gauges(
            enc,
            self.rows().iter().flat_map(|r| {
                r.devices.iter().map(move |d| {
                    let mut l = self.cgroup(&r.cgroup);
                    l.extend(self.gpu(d.device));
                    (l, d.memory_used_bytes as f64)
                })
            }),
        )?;
        bytes(
            "cgroup_memory_subtree",
            "GPU memory held by the cgroup and all its descendants (what its own limit is checked against), all devices",
        )
        .gauges(enc, self.per_cgroup(|r| Some(r.memory_subtree_bytes as f64)))?;
        bytes(
            "cgroup_memory_limit",
            "The memory limit that applies to the cgroup on each device (its own or an ancestor's); with per-GPU limits one series per GPU (gpu and UUID labels); absent when none does",
        )
        .gauges(
            enc,
            self.rows().iter().flat_map(|r| -> Vec<(Labels, f64)> {
                if r.memory_limit_gpus.is_empty() {
                    return r
                        .memory_limit_bytes
                        .map(|b| (self.cgroup(&r.cgroup), b as f64))
                        .into_iter()
                        .collect();
                }
                r.devices
                    .iter()
                    .filter_map(|d| {
                        let mut l = self.cgroup(&r.cgroup);
                        l.extend(self.gpu(d.device));
                        Some((l, d.limit_bytes? as f64))
                    })
                    .collect()
            }),
        )?;
        fam(
            "cgroup_processes",
            "Processes holding GPU memory charged to the cgroup",
        )
        .gauges(enc, self.per_cgroup(|r| Some(r.pids.len() as f64)))?;
        fam(
            "cgroup_allocations",
            "Allocations charged to the cgroup since the agent started, per device",
        )
        .counters(
            enc,
            self.rows().iter().flat_map(|r| {
                r.devices.iter().map(move |d| {
                    let mut l = self.cgroup(&r.cgroup);
                    l.extend(self.gpu(d.device));
                    (l, d.allocs as f64)
                })
            }),
        )?;
        fam(
            "cgroup_alloc_denied",
            "Allocations the shims refused because they would have crossed the limit (the ledger's count)",
        )
        .counters(enc, self.per_cgroup(|r| Some(r.alloc_denied as f64)))?;
        fam(
            "cgroup_backstop_actions",
            "Times the kernel backstop found the cgroup over its limit and acted (killed or reported, per --on-exceed)",
        )
        .counters(enc, self.per_cgroup(|r| Some(r.over_limit_actions as f64)))?;
        fam(
            "cgroup_kernel_kills",
            "Processes of the cgroup the kernel killed at the allocation that took it past its limit or bound",
        )
        .counters(enc, self.per_cgroup(|r| Some(r.kernel_kills as f64)))?;
        fam(
            "cgroup_untracked_allocations",
            "Allocations of the cgroup not tracked because it reached its bound on tracking entries",
        )
        .counters(enc, self.per_cgroup(|r| Some(r.over_bound as f64)))?;
        fam(
            "cgroup_compute_share_ratio",
            "Configured guaranteed compute share (0-1); absent when none",
        )
        .gauges(
            enc,
            self.per_gpu_compute(|r| (&r.compute_share_gpus, r.compute_share_pct)),
        )?;
        fam(
            "cgroup_compute_cap_ratio",
            "Configured compute cap (0-1); absent when none",
        )
        .gauges(
            enc,
            self.per_gpu_compute(|r| (&r.compute_cap_gpus, r.compute_cap_pct)),
        )?;
        fam(
            "cgroup_compute_used_ratio",
            "GPU time the cgroup's gated launches used over the last 5 s, fraction of wall time summed over devices; absent when not gated",
        )
        .gauges(
            enc,
            self.per_cgroup(|r| r.compute_used_pct.map(|p| p / 100.0)),
        )?;
        fam(
            "cgroup_compute_turn_ratio",
            "Device time the cgroup held in turns over the last 5 s, fraction of wall time summed over devices (what a share is a share of); absent when not gated",
        )
        .gauges(
            enc,
            self.per_cgroup(|r| r.compute_turn_pct.map(|p| p / 100.0)),
        )?;
        fam(
            "cgroup_compute_corun",
            "1 while the cgroup runs beside the turn holder (latency-bound, under its share) on some device",
        )
        .gauges(
            enc,
            self.per_cgroup(|r| {
                r.compute_used_pct
                    .map(|_| if r.compute_corun { 1.0 } else { 0.0 })
            }),
        )?;
        fam(
            "cgroup_compute_queue_seconds",
            "Estimated GPU time each of the cgroup's processes may have queued on a device (the controller's queue bound, scaled by the cgroup's active processes); absent when not gated",
        )
        .gauges(
            enc,
            self.per_cgroup(|r| r.compute_queue_us.map(|us| us as f64 / 1e6)),
        )?;
        Ok(())
    }

    fn encode_ledgers(&self, enc: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        let per_device = |f: fn(&LedgerDevice) -> f64| {
            self.0.ledger_devices.iter().map(move |d| {
                let mut l: Labels = vec![("ledger", labels::value(&d.ledger))];
                l.extend(self.gpu(d.gpu));
                l.extend(self.host());
                (l, f(d))
            })
        };
        fam(
            "ledger_compute_turns",
            "Turns on the device the compute controller granted to the ledger (its cgroup's subtree)",
        )
        .counters(enc, per_device(|d| d.turns as f64))?;
        seconds(
            "ledger_gpu_time",
            "GPU time the ledger's shims measured on the device (gated launches)",
        )
        .counters(enc, per_device(|d| d.gpu_time_s))?;
        let mut m = enc.encode_descriptor(
            "compute_switch",
            "Time a gated device went without a holder when the turn passed to another tenant (the previous holder's drain and the grant), per GPU",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        for (gpu, h) in &self.0.switches {
            let mut l = self.gpu(*gpu);
            l.extend(self.host());
            h.encode(m.encode_family(&l)?)?;
        }
        Ok(())
    }

    fn encode_node(&self, enc: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        let c = &self.0.report.counters;
        let host = || [(self.host(), 0.0)];
        let one = |v: u64| [(self.host(), v as f64)];
        fam(
            "events_dropped",
            "Kernel events that did not fit in the ring buffer (totals stay exact: they live in maps)",
        )
        .counters(enc, one(c.ringbuf_drops))?;
        fam(
            "untracked_allocations",
            "Allocations the kernel could not track: a map was full (reason=map_full) or the tenant reached its bound (reason=over_bound)",
        )
        .counters(
            enc,
            [("map_full", c.map_full), ("over_bound", c.over_bound)].map(|(reason, v)| {
                let mut l = self.host();
                l.push(("reason", reason.to_string()));
                (l, v as f64)
            }),
        )?;
        fam(
            "unknown_frees",
            "Frees of pointers never seen allocated (allocated before the agent started)",
        )
        .counters(enc, one(c.unknown_frees))?;
        fam(
            "failed_calls",
            "Probed driver calls that returned an error (nothing charged)",
        )
        .counters(enc, one(c.failed_calls))?;
        fam(
            "kernel_over_limit",
            "Allocations that took a limited cgroup past its limit (the kernel acted on each)",
        )
        .counters(enc, one(c.over_limit))?;
        fam(
            "kernel_killed",
            "Processes the kernel SIGKILLed at such an allocation (--on-exceed kill)",
        )
        .counters(enc, one(c.killed))?;
        fam(
            "probed_libraries",
            "Driver libraries the probes are attached to",
        )
        .gauges(enc, one(self.0.report.libraries.len() as u64))?;
        fam("ledgers", "Ledgers (shared budgets) the agent keeps")
            .gauges(enc, one(self.0.ledgers as u64))?;
        fam(
            "shims_connected",
            "Live processes whose shim said Hello to this agent",
        )
        .gauges(enc, one(self.0.shims as u64))?;
        fam(
            "metrics_cgroups_omitted",
            "Cgroups left out of this scrape to bound its size",
        )
        .gauges(
            enc,
            one(self.0.report.cgroups.len().saturating_sub(MAX_CGROUPS) as u64),
        )?;
        fam(
            "agent_ready",
            "1 once the probes are attached and the sockets served",
        )
        .gauges(
            enc,
            host().map(|(l, _)| (l, if self.0.ready { 1.0 } else { 0.0 })),
        )?;
        let mut info = enc.encode_descriptor(
            "gpu",
            "The node's GPUs as NVML lists them (the value is 1), with DCGM exporter's labels",
            None,
            MetricType::Info,
        )?;
        for g in &self.0.gpus {
            let mut l = self.gpu(g.index);
            l.push(("model_name", labels::value(&g.name)));
            l.extend(self.host());
            info.encode_info(&l)?;
        }
        bytes("gpu_memory_total", "Memory of each GPU, as NVML reports it").gauges(
            enc,
            self.0.gpus.iter().map(|g| {
                let mut l = self.gpu(g.index);
                l.extend(self.host());
                (l, g.memory_total_bytes as f64)
            }),
        )?;
        Ok(())
    }
}

impl Collector for SampleCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        self.encode_cgroups(&mut enc)?;
        self.encode_ledgers(&mut enc)?;
        self.encode_node(&mut enc)
    }
}

/// The names of the series the agent exports (`# TYPE` names, with the suffixes their
/// samples carry: `_total` for counters, `_info` for infos), read from an encoded
/// registry: what the dashboard may use.
#[cfg(test)]
pub fn exported_names() -> Vec<String> {
    let text = encode(Sample::default());
    let mut names = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut it = rest.split_whitespace();
        let (Some(name), Some(ty)) = (it.next(), it.next()) else {
            continue;
        };
        match ty {
            "counter" => names.push(format!("{name}_total")),
            "info" => names.push(format!("{name}_info")),
            "histogram" => {
                names.extend(["bucket", "sum", "count"].map(|s| format!("{name}_{s}")));
            }
            _ => names.push(name.to_string()),
        }
    }
    names
}
