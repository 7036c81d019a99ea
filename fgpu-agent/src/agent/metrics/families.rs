//! The metric families of one [`Sample`] of the agent's state, as data ([`Family`]): every
//! family is rebuilt from the sample, so that a cgroup that is gone from the sample has no
//! series any more. [`encode`] writes them in the format a scraper asked for.
//!
//! Names, types and labels are documented in docs/observability.md; keep the two in step.

use crate::agent::compute::Gaps;
use std::collections::BTreeMap;

use super::model::{Family, HistogramSnapshot, Labels, Series, Unit};
#[cfg(test)]
use super::negotiate::Format;
use crate::agent::gpus::Gpu;
use crate::status::{CgroupStatus, StatusReport, printable as value};
use fgpu_common::cgroup::naming;

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
    pub switches: Vec<(u32, Gaps)>,
    /// What parking did (docs/parking.md).
    pub park: crate::agent::park::Figures,
    pub ready: bool,
}

/// The families of one sample, in the order they are written.
pub fn families(sample: &Sample) -> Vec<Family> {
    let b = Families(sample);
    let mut out = Vec::new();
    b.cgroups(&mut out);
    b.parking(&mut out);
    b.ledgers(&mut out);
    b.node(&mut out);
    out
}

/// The exposition of one sample in `format` (the listener encodes both at once).
#[cfg(test)]
pub fn encode(sample: &Sample, format: Format) -> String {
    let families = families(sample);
    match format {
        Format::OpenMetrics => super::openmetrics::encode(&families),
        Format::Classic => super::classic::encode(&families),
    }
}

struct Families<'s>(&'s Sample);

/// A family's name, help and unit, before its series.
struct Def {
    name: &'static str,
    help: &'static str,
    unit: Option<Unit>,
}

impl Def {
    fn gauges(self, out: &mut Vec<Family>, series: impl IntoIterator<Item = (Labels, f64)>) {
        self.push(out, Series::Gauge(series.into_iter().collect()));
    }

    fn counters(self, out: &mut Vec<Family>, series: impl IntoIterator<Item = (Labels, f64)>) {
        self.push(out, Series::Counter(series.into_iter().collect()));
    }

    fn push(self, out: &mut Vec<Family>, series: Series) {
        out.push(Family {
            name: self.name,
            help: self.help,
            unit: self.unit,
            series,
        });
    }
}

const fn fam(name: &'static str, help: &'static str) -> Def {
    Def {
        name,
        help,
        unit: None,
    }
}

const fn bytes(name: &'static str, help: &'static str) -> Def {
    Def {
        name,
        help,
        unit: Some(Unit::Bytes),
    }
}

const fn seconds(name: &'static str, help: &'static str) -> Def {
    Def {
        name,
        help,
        unit: Some(Unit::Seconds),
    }
}

impl Families<'_> {
    fn host(&self) -> Labels {
        vec![("Hostname", value(&self.0.hostname))]
    }

    /// A cgroup's labels: its path, what the path says about its container and pod
    /// ([`naming`]; not a pod's or container's name, which the path does not say), the node.
    fn cgroup(&self, path: &str) -> Labels {
        let who = naming::identity(path);
        let mut l: Labels = vec![("cgroup", value(path))];
        if let Some(c) = who.container {
            l.push(("container_id", c.id));
        }
        if let Some(pod) = who.pod {
            l.push(("pod_uid", pod.uid));
        }
        l.push(("Hostname", value(&self.0.hostname)));
        l
    }

    /// A device's labels as DCGM's exporter writes them (`gpu` index, `UUID`).
    fn gpu(&self, index: u32) -> Labels {
        let uuid = self
            .0
            .gpus
            .iter()
            .find(|g| g.index == index)
            .map_or_else(String::new, |g| value(&g.uuid));
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

    fn cgroups(&self, out: &mut Vec<Family>) {
        bytes(
            "cgroup_memory_used",
            "GPU memory the kernel saw allocated by the cgroup's own processes and not freed, per device",
        )
        .gauges(
            out,
            self.rows().iter().flat_map(|r| {
                r.devices.iter().map(move |d| {
                    let mut l = self.cgroup(&r.cgroup);
                    l.extend(self.gpu(d.device));
                    (l, d.memory_used_bytes as f64)
                })
            }),
        );
        bytes(
            "cgroup_memory_subtree",
            "GPU memory held by the cgroup and all its descendants (what its own limit is checked against), all devices",
        )
        .gauges(out, self.per_cgroup(|r| Some(r.memory_subtree_bytes as f64)));
        bytes(
            "cgroup_memory_limit",
            "The memory limit that applies to the cgroup on each device (its own or an ancestor's); with per-GPU limits one series per GPU (gpu and UUID labels); absent when none does",
        )
        .gauges(
            out,
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
        );
        fam(
            "cgroup_processes",
            "Processes holding GPU memory charged to the cgroup",
        )
        .gauges(out, self.per_cgroup(|r| Some(r.pids.len() as f64)));
        fam(
            "cgroup_allocations",
            "Allocations charged to the cgroup since the agent started, per device",
        )
        .counters(
            out,
            self.rows().iter().flat_map(|r| {
                r.devices.iter().map(move |d| {
                    let mut l = self.cgroup(&r.cgroup);
                    l.extend(self.gpu(d.device));
                    (l, d.allocs as f64)
                })
            }),
        );
        fam(
            "cgroup_alloc_denied_reported",
            "Allocations the cgroup's shims report they refused at its limit: the tenant's own count, written in its usage page, not checked by the agent",
        )
        .counters(out, self.per_cgroup(|r| Some(r.alloc_denied as f64)));
        fam(
            "cgroup_backstop_actions",
            "Times the kernel backstop found the cgroup over its limit and acted (killed or reported, per --on-exceed)",
        )
        .counters(out, self.per_cgroup(|r| Some(r.over_limit_actions as f64)));
        fam(
            "cgroup_kernel_kills",
            "Processes of the cgroup the kernel killed at the allocation that took it past its limit or bound",
        )
        .counters(out, self.per_cgroup(|r| Some(r.kernel_kills as f64)));
        fam(
            "cgroup_untracked_allocations",
            "Allocations of the cgroup not tracked because it reached its bound on tracking entries",
        )
        .counters(out, self.per_cgroup(|r| Some(r.over_bound as f64)));
        fam(
            "cgroup_compute_share_ratio",
            "Configured guaranteed compute share (0-1); absent when none",
        )
        .gauges(
            out,
            self.per_gpu_compute(|r| (&r.compute_share_gpus, r.compute_share_pct)),
        );
        fam(
            "cgroup_compute_cap_ratio",
            "Configured compute cap (0-1); absent when none",
        )
        .gauges(
            out,
            self.per_gpu_compute(|r| (&r.compute_cap_gpus, r.compute_cap_pct)),
        );
        fam(
            "cgroup_compute_used_ratio",
            "GPU time the cgroup's gated launches used over the last 5 s, fraction of wall time summed over devices; absent when not gated",
        )
        .gauges(
            out,
            self.per_cgroup(|r| r.compute_used_pct.map(|p| p / 100.0)),
        );
        fam(
            "cgroup_compute_turn_ratio",
            "Device time the cgroup held in turns over the last 5 s, fraction of wall time summed over devices (what a share is a share of); absent when not gated",
        )
        .gauges(
            out,
            self.per_cgroup(|r| r.compute_turn_pct.map(|p| p / 100.0)),
        );
        fam(
            "cgroup_compute_corun",
            "1 while the cgroup runs beside the turn holder (latency-bound, under its share) on some device",
        )
        .gauges(
            out,
            self.per_cgroup(|r| {
                r.compute_used_pct
                    .map(|_| if r.compute_corun { 1.0 } else { 0.0 })
            }),
        );
        fam(
            "cgroup_compute_queue_seconds",
            "Estimated GPU time each of the cgroup's processes may have queued on a device (the controller's queue bound, scaled by the cgroup's active processes); absent when not gated",
        )
        .gauges(
            out,
            self.per_cgroup(|r| r.compute_queue_us.map(|us| us as f64 / 1e6)),
        );
    }

    fn parking(&self, out: &mut Vec<Family>) {
        bytes(
            "cgroup_parked",
            "Device memory of the cgroup's processes parked in host memory now (docs/parking.md), all devices",
        )
        .gauges(out, self.per_cgroup(|r| Some(r.parked_bytes as f64)));
        let p = &self.0.park;
        let per = |f: fn(&crate::agent::park::CgroupFigures) -> f64| {
            p.per_cgroup
                .iter()
                .take(MAX_CGROUPS)
                .map(move |(cg, c)| (self.cgroup(cg), f(c)))
                .collect::<Vec<_>>()
        };
        fam(
            "cgroup_parks",
            "Times a process of the cgroup (its ledger) moved its device memory to host memory",
        )
        .counters(out, per(|c| c.parks as f64));
        fam(
            "cgroup_unparks",
            "Times a process of the cgroup (its ledger) brought its device memory back",
        )
        .counters(out, per(|c| c.unparks as f64));
        bytes(
            "cgroup_park_moved",
            "Device memory the cgroup's parks moved to host memory",
        )
        .counters(out, per(|c| c.parked_bytes as f64));
        seconds(
            "cgroup_park_wait",
            "Time the cgroup's launches, copies and allocations waited for their memory to come back",
        )
        .counters(out, per(|c| c.wait_s));
        let node = |g: &Gaps| vec![(self.host(), HistogramSnapshot::of(g))];
        seconds(
            "park_duration",
            "How long a park took: host memory, the copies out, the device memory given back",
        )
        .push(out, Series::Histogram(node(&p.park)));
        seconds(
            "unpark_duration",
            "How long an unpark took, without waiting for room or for the limit: device memory mapped again and the copies in",
        )
        .push(out, Series::Histogram(node(&p.unpark)));
    }

    fn ledgers(&self, out: &mut Vec<Family>) {
        let per_device = |f: fn(&LedgerDevice) -> f64| {
            self.0.ledger_devices.iter().map(move |d| {
                let mut l: Labels = vec![("ledger", value(&d.ledger))];
                l.extend(self.gpu(d.gpu));
                l.extend(self.host());
                (l, f(d))
            })
        };
        fam(
            "ledger_compute_turns",
            "Turns on the device the compute controller granted to the ledger (its cgroup's subtree)",
        )
        .counters(out, per_device(|d| d.turns as f64));
        seconds(
            "ledger_gpu_time",
            "GPU time the ledger's shims measured on the device (gated launches)",
        )
        .counters(out, per_device(|d| d.gpu_time_s));
        let switches = self.0.switches.iter().map(|(gpu, g)| {
            let mut l = self.gpu(*gpu);
            l.extend(self.host());
            (l, HistogramSnapshot::of(g))
        });
        seconds(
            "compute_switch",
            "Time a gated device went without a holder when the turn passed to another tenant (the previous holder's drain and the grant), per GPU",
        )
        .push(out, Series::Histogram(switches.collect()));
    }

    fn node(&self, out: &mut Vec<Family>) {
        let c = &self.0.report.counters;
        let host = || [(self.host(), 0.0)];
        let one = |v: u64| [(self.host(), v as f64)];
        fam(
            "events_dropped",
            "Kernel events that did not fit in the ring buffer (totals stay exact: they live in maps)",
        )
        .counters(out, one(c.ringbuf_drops));
        fam(
            "untracked_allocations",
            "Allocations the kernel could not track: a map was full (reason=map_full) or the tenant reached its bound (reason=over_bound)",
        )
        .counters(
            out,
            [("map_full", c.map_full), ("over_bound", c.over_bound)].map(|(reason, v)| {
                let mut l = self.host();
                l.push(("reason", reason.to_string()));
                (l, v as f64)
            }),
        );
        fam(
            "unknown_frees",
            "Frees of pointers never seen allocated (allocated before the agent started)",
        )
        .counters(out, one(c.unknown_frees));
        fam(
            "failed_calls",
            "Probed driver calls that returned an error (nothing charged)",
        )
        .counters(out, one(c.failed_calls));
        fam(
            "kernel_over_limit",
            "Allocations that took a limited cgroup past its limit (the kernel acted on each)",
        )
        .counters(out, one(c.over_limit));
        fam(
            "kernel_killed",
            "Processes the kernel SIGKILLed at such an allocation (--on-exceed kill)",
        )
        .counters(out, one(c.killed));
        fam(
            "probed_libraries",
            "Driver libraries the probes are attached to",
        )
        .gauges(out, one(self.0.report.libraries.len() as u64));
        fam("ledgers", "Ledgers (shared budgets) the agent keeps")
            .gauges(out, one(self.0.ledgers as u64));
        fam(
            "shims_connected",
            "Live processes whose shim said Hello to this agent",
        )
        .gauges(out, one(self.0.shims as u64));
        fam(
            "metrics_cgroups_omitted",
            "Cgroups left out of this scrape to bound its size",
        )
        .gauges(
            out,
            one(self.0.report.cgroups.len().saturating_sub(MAX_CGROUPS) as u64),
        );
        fam(
            "agent_ready",
            "1 once the probes are attached and the sockets served",
        )
        .gauges(
            out,
            host().map(|(l, _)| (l, if self.0.ready { 1.0 } else { 0.0 })),
        );
        let gpus = self.0.gpus.iter().map(|g| {
            let mut l = self.gpu(g.index);
            l.push(("model_name", value(&g.name)));
            l.extend(self.host());
            l
        });
        fam(
            "gpu",
            "The node's GPUs as NVML lists them (the value is 1), with DCGM exporter's labels",
        )
        .push(out, Series::Info(gpus.collect()));
        bytes("gpu_memory_total", "Memory of each GPU, as NVML reports it").gauges(
            out,
            self.0.gpus.iter().map(|g| {
                let mut l = self.gpu(g.index);
                l.extend(self.host());
                (l, g.memory_total_bytes as f64)
            }),
        );
    }
}

/// The names of the series the agent exports (`# TYPE` names, with the suffixes their
/// samples carry: `_total` for counters, `_info` for infos), read from an encoded
/// OpenMetrics exposition: what the dashboard may use.
#[cfg(test)]
pub fn exported_names() -> Vec<String> {
    let text = encode(&Sample::default(), Format::OpenMetrics);
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
