//! The OpenMetrics 1.0.0 text of the families, written by the official `prometheus-client`
//! crate (a [`Collector`] over the sample's families): counters as families `x` whose
//! samples are `x_total`, infos as `x` with samples `x_info`, a `# UNIT` line for sized
//! families, `# EOF` at the end.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

use super::model::{Family, HistogramSnapshot, PREFIX, Series};

/// The OpenMetrics exposition of `families`.
pub fn encode(families: &[Family]) -> String {
    let mut registry = Registry::with_prefix(PREFIX);
    registry.register_collector(Box::new(Families(Arc::from(families.to_vec()))));
    let mut body = String::new();
    // Writing into a String cannot fail; an error here would be a bug of the encoder.
    if let Err(err) = prometheus_client::encoding::text::encode(&mut body, &registry) {
        tracing::error!("encoding the metrics (OpenMetrics) failed: {err}");
    }
    body
}

#[derive(Debug)]
struct Families(Arc<[Family]>);

impl Collector for Families {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        for f in self.0.iter() {
            let unit = f.unit.map(|u| match u {
                super::model::Unit::Bytes => Unit::Bytes,
                super::model::Unit::Seconds => Unit::Seconds,
            });
            let ty = match &f.series {
                Series::Gauge(_) => MetricType::Gauge,
                Series::Counter(_) => MetricType::Counter,
                Series::Info(_) => MetricType::Info,
                Series::Histogram(_) => MetricType::Histogram,
            };
            let mut m = enc.encode_descriptor(f.name, f.help, unit.as_ref(), ty)?;
            match &f.series {
                Series::Gauge(s) => {
                    for (labels, v) in s {
                        ConstGauge::new(*v).encode(m.encode_family(labels)?)?;
                    }
                }
                Series::Counter(s) => {
                    for (labels, v) in s {
                        ConstCounter::new(*v).encode(m.encode_family(labels)?)?;
                    }
                }
                Series::Info(s) => {
                    for labels in s {
                        m.encode_info(labels)?;
                    }
                }
                Series::Histogram(s) => {
                    for (labels, h) in s {
                        h.encode(m.encode_family(labels)?)?;
                    }
                }
            }
        }
        Ok(())
    }
}

impl EncodeMetric for HistogramSnapshot {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> std::fmt::Result {
        // prometheus-client takes each bucket's own count, its last bound as `f64::MAX`.
        let mut below = 0;
        let buckets: Vec<(f64, u64)> = self
            .buckets
            .iter()
            .map(|&(le, cumulative)| {
                let own = cumulative.saturating_sub(below);
                below = cumulative;
                (if le.is_infinite() { f64::MAX } else { le }, own)
            })
            .collect();
        encoder.encode_histogram::<NoLabelSet>(self.sum, self.count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}
