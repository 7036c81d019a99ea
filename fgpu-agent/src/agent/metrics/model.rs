//! The families of one scrape as plain data: built once per sample ([`super::families`]),
//! then written by either encoder ([`super::openmetrics`], [`super::classic`]), so that the
//! two formats always say the same thing.

use crate::agent::compute::Gaps;

/// Every name starts with this.
pub const PREFIX: &str = "fgpu";

/// A series' labels, in the order they are written.
pub type Labels = Vec<(&'static str, String)>;

/// The unit a family's name ends with (OpenMetrics also says it in a `# UNIT` line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    Seconds,
}

impl Unit {
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Bytes => "bytes",
            Unit::Seconds => "seconds",
        }
    }
}

/// A family's series, by type.
#[derive(Debug, Clone)]
pub enum Series {
    Gauge(Vec<(Labels, f64)>),
    Counter(Vec<(Labels, f64)>),
    /// Info series: the value is 1.
    Info(Vec<Labels>),
    Histogram(Vec<(Labels, HistogramSnapshot)>),
}

impl Series {
    pub fn is_empty(&self) -> bool {
        match self {
            Series::Gauge(s) | Series::Counter(s) => s.is_empty(),
            Series::Info(s) => s.is_empty(),
            Series::Histogram(s) => s.is_empty(),
        }
    }
}

/// One metric family: its name without the prefix, unit or type suffix (`cgroup_allocations`),
/// its help, its unit and its series.
#[derive(Debug, Clone)]
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub unit: Option<Unit>,
    pub series: Series,
}

impl Family {
    /// `fgpu_<name>[_<unit>]`: the OpenMetrics family name (and the classic one of gauges and
    /// histograms).
    pub fn full_name(&self) -> String {
        match self.unit {
            Some(u) => format!("{PREFIX}_{}_{}", self.name, u.as_str()),
            None => format!("{PREFIX}_{}", self.name),
        }
    }
}

/// A histogram as it was when the sample was taken (the agent's histograms go on counting).
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    pub sum: f64,
    pub count: u64,
    /// (upper bound, cumulative count), ascending; the last bound is `+Inf`.
    pub buckets: Vec<(f64, u64)>,
}

impl HistogramSnapshot {
    /// The figures of the controller's histogram `g` now.
    pub fn of(g: &Gaps) -> HistogramSnapshot {
        HistogramSnapshot {
            sum: g.sum,
            count: g.count,
            buckets: g.cumulative(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_has_the_histograms_figures_and_keeps_them() {
        let mut g = Gaps::new(&[0.001, 0.01, 0.1]);
        for v in [0.0005, 0.004, 0.004, 0.05, 3.0] {
            g.observe(v);
        }
        let snap = HistogramSnapshot::of(&g);
        assert_eq!(snap.count, 5);
        assert!((snap.sum - 3.0585).abs() < 1e-12, "{}", snap.sum);
        assert_eq!(
            snap.buckets,
            vec![(0.001, 1), (0.01, 3), (0.1, 4), (f64::INFINITY, 5)]
        );
        g.observe(0.0001);
        assert_eq!(snap.count, 5, "a snapshot does not follow the histogram");
        assert_eq!(HistogramSnapshot::of(&g).buckets[0], (0.001, 2));
    }
}
