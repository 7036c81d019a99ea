//! The classic Prometheus text format 0.0.4 of the families (what `promtool check metrics`,
//! Prometheus servers before OpenMetrics, and scrapers that ask for `text/plain` read),
//! written by tikv's `prometheus` crate ([`TextEncoder`], its own plain data model: no
//! protobuf).
//!
//! prometheus-client, which writes the OpenMetrics form, has no encoder of this format (0.24,
//! nor 0.25). tikv's is maintained, escapes label values and help, and writes the `+Inf`
//! bucket of a histogram; this module only says what each of our families is in the
//! classic model, where a family's name is the name its samples carry:
//!
//! - a counter `x` is the counter family `x_total` (`# TYPE x_total counter`, samples
//!   `x_total`);
//! - an info `x` is the gauge `x_info` with value 1 (the classic format has no infos);
//! - gauges and histograms keep their names (`# TYPE x histogram`, `x_bucket`, `x_sum`,
//!   `x_count`);
//! - units stay in the names (`_bytes`, `_seconds`), without `# UNIT` lines; no `# EOF`, no
//!   `_created`;
//! - a family without series is left out (the classic format has no empty families; the Go
//!   client leaves them out too).

use prometheus::TextEncoder;
use prometheus::proto::{self, MetricType};

use super::model::{Family, HistogramSnapshot, Labels, Series};

/// The content type of what [`encode`] writes.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The classic text exposition of `families`.
pub fn encode(families: &[Family]) -> String {
    let families: Vec<proto::MetricFamily> = families
        .iter()
        .filter(|f| !f.series.is_empty())
        .map(family)
        .collect();
    let mut body = String::new();
    // The encoder fails on a family without series or name only; neither is given to it.
    if let Err(err) = TextEncoder::new().encode_utf8(&families, &mut body) {
        tracing::error!("encoding the metrics (text 0.0.4) failed: {err}");
    }
    body
}

fn family(f: &Family) -> proto::MetricFamily {
    let base = f.full_name();
    let (name, ty, metrics): (String, MetricType, Vec<proto::Metric>) = match &f.series {
        Series::Gauge(s) => (base, MetricType::GAUGE, s.iter().map(gauge).collect()),
        Series::Counter(s) => (
            format!("{base}_total"),
            MetricType::COUNTER,
            s.iter().map(counter).collect(),
        ),
        Series::Info(s) => (
            format!("{base}_info"),
            MetricType::GAUGE,
            s.iter().map(|l| gauge(&(l.clone(), 1.0))).collect(),
        ),
        Series::Histogram(s) => (
            base,
            MetricType::HISTOGRAM,
            s.iter().map(|(l, h)| histogram(l, h)).collect(),
        ),
    };
    let mut mf = proto::MetricFamily::default();
    mf.set_name(name);
    mf.set_help(f.help.to_string());
    mf.set_field_type(ty);
    mf.set_metric(metrics);
    mf
}

fn labelled(labels: &Labels) -> proto::Metric {
    let pairs = labels
        .iter()
        .map(|(k, v)| {
            let mut p = proto::LabelPair::default();
            p.set_name((*k).to_string());
            p.set_value(v.clone());
            p
        })
        .collect();
    let mut m = proto::Metric::default();
    m.set_label(pairs);
    m
}

fn gauge((labels, v): &(Labels, f64)) -> proto::Metric {
    let mut g = proto::Gauge::default();
    g.set_value(*v);
    let mut m = labelled(labels);
    m.set_gauge(g);
    m
}

fn counter((labels, v): &(Labels, f64)) -> proto::Metric {
    let mut c = proto::Counter::default();
    c.set_value(*v);
    let mut m = labelled(labels);
    m.set_counter(c);
    m
}

fn histogram(labels: &Labels, h: &HistogramSnapshot) -> proto::Metric {
    let mut p = proto::Histogram::default();
    p.set_sample_sum(h.sum);
    p.set_sample_count(h.count);
    // The encoder writes the `+Inf` bucket (the count) itself when it is not given one.
    p.set_bucket(
        h.buckets
            .iter()
            .filter(|(le, _)| le.is_finite())
            .map(|&(le, n)| {
                let mut b = proto::Bucket::default();
                b.set_upper_bound(le);
                b.set_cumulative_count(n);
                b
            })
            .collect(),
    );
    let mut m = labelled(labels);
    m.set_histogram(p);
    m
}
