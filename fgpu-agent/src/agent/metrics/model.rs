//! The families of one scrape as plain data: built once per sample ([`super::families`]),
//! then written by either encoder ([`super::openmetrics`], [`super::classic`]), so that the
//! two formats always say the same thing.

use prometheus_client::metrics::histogram::Histogram;

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
    /// The figures of `h`. prometheus-client (0.24, and 0.25 still) keeps a histogram's bucket
    /// counts to itself (`Histogram::get` is crate-private): its own encoder is the one public
    /// way to read them, so they are read back from the exposition of `h` alone (one lock:
    /// sum, count and buckets agree). `None` if that exposition is not what it writes.
    pub fn of(h: &Histogram) -> Option<HistogramSnapshot> {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("h", "", h.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).ok()?;
        let (mut sum, mut count, mut buckets) = (None, None, Vec::new());
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (name, value) = line.rsplit_once(' ')?;
            if name == "h_sum" {
                sum = Some(value.parse().ok()?);
            } else if name == "h_count" {
                count = Some(value.parse().ok()?);
            } else {
                let le = name.strip_prefix("h_bucket{le=\"")?.strip_suffix("\"}")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                buckets.push((le, value.parse().ok()?));
            }
        }
        let snap = HistogramSnapshot {
            sum: sum?,
            count: count?,
            buckets,
        };
        let ascending = snap.buckets.windows(2).all(|w| w[0] < w[1]);
        let last = snap.buckets.last()?;
        (ascending && *last == (f64::INFINITY, snap.count)).then_some(snap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_has_the_histograms_figures_and_keeps_them() {
        let h = Histogram::new([0.001, 0.01, 0.1]);
        for v in [0.0005, 0.004, 0.004, 0.05, 3.0] {
            h.observe(v);
        }
        let snap = HistogramSnapshot::of(&h).expect("a snapshot");
        assert_eq!(snap.count, 5);
        assert!((snap.sum - 3.0585).abs() < 1e-12, "{}", snap.sum);
        assert_eq!(
            snap.buckets,
            vec![(0.001, 1), (0.01, 3), (0.1, 4), (f64::INFINITY, 5)]
        );
        h.observe(0.0001);
        assert_eq!(snap.count, 5, "a snapshot does not follow the histogram");
        assert_eq!(HistogramSnapshot::of(&h).unwrap().buckets[0], (0.001, 2));
    }

    #[test]
    fn an_empty_histogram_has_zero_buckets() {
        let snap = HistogramSnapshot::of(&Histogram::new([0.5])).unwrap();
        assert_eq!(
            (snap.sum, snap.count, snap.buckets),
            (0.0, 0, vec![(0.5, 0), (f64::INFINITY, 0)])
        );
    }
}
