//! Every service's `/metrics`: each metric family declared once (name, type, help, label
//! names), its samples read at scrape time, and the exposition written by the Prometheus
//! project's client library (`prometheus-client`, OpenMetrics text) rather than by hand.
//!
//! The values live where they always did (atomics, counters behind a mutex, the store), so a
//! page is a [`prometheus_client::collector::Collector`] filled on each scrape:
//!
//! ```
//! use telemark_transport::metrics::Exposition;
//! let mut page = Exposition::default();
//! page.counter("demo_requests_total", "Requests answered, by route.", &["route"])
//!     .sample(&["/metrics"], 3u64);
//! let text = page.encode();
//! assert!(text.contains("demo_requests_total{route=\"/metrics\"} 3\n"));
//! assert!(text.ends_with("# EOF\n"));
//! ```
//!
//! Names are the sample names as scraped (and documented). OpenMetrics names a counter's
//! family without its `_total`, which the library adds to each sample; so every counter's name
//! must end in `_total` (checked), and the page keeps its sample names.

use crate::http::Response;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// The content type of [`Exposition::response`] (OpenMetrics 1.0, which Prometheus asks for
/// first and parses).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A sample's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A whole number (counters and gauges).
    Int(u64),
    /// A whole number that may be negative (gauges).
    Signed(i64),
    /// A real number (seconds, for example).
    Real(f64),
    /// A histogram: the sum and count of observations, and per bucket its upper bound and the
    /// observations at most that (cumulative, as Prometheus reads them; the last bound is
    /// `+Inf`, added here).
    Histogram {
        /// Sum of the observations.
        sum: f64,
        /// Number of observations.
        count: u64,
        /// `(upper bound, observations <= bound)`, bounds rising, without `+Inf`.
        buckets: Vec<(f64, u64)>,
    },
}

impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::Int(v)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Signed(v)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Real(v)
    }
}

/// One metric family: declared once with its type, help and label names; samples added with
/// their label values.
#[derive(Debug)]
pub struct Family {
    name: String,
    help: String,
    kind: MetricType,
    /// Label names: the page's common ones (see [`Exposition::with_label`]), then its own.
    labels: Vec<String>,
    /// The common labels' values, in front of each sample's own.
    common: Vec<String>,
    samples: Vec<(Vec<String>, Value)>,
}

impl Family {
    /// Adds a sample: one value per label name of the family's own, in the declared order.
    pub fn sample<S: AsRef<str>>(&mut self, values: &[S], v: impl Into<Value>) -> &mut Family {
        debug_assert_eq!(
            self.common.len() + values.len(),
            self.labels.len(),
            "{}: label values",
            self.name
        );
        let mut all = self.common.clone();
        all.extend(values.iter().map(|s| s.as_ref().to_string()));
        self.samples.push((all, v.into()));
        self
    }

    /// Adds the one sample of a family without labels of its own.
    pub fn value(&mut self, v: impl Into<Value>) -> &mut Family {
        self.sample::<&str>(&[], v)
    }

    /// Adds a sample per `(label values, value)`.
    pub fn samples<L, S, V>(&mut self, rows: impl IntoIterator<Item = (L, V)>) -> &mut Family
    where
        L: AsRef<[S]>,
        S: AsRef<str>,
        V: Into<Value>,
    {
        for (labels, v) in rows {
            self.sample(labels.as_ref(), v);
        }
        self
    }
}

/// A `/metrics` page: its families, in order.
#[derive(Debug, Default)]
pub struct Exposition {
    families: Vec<Family>,
    /// Labels every sample of the families declared from now on carries first (the agent's
    /// `agent`, the INT collector's `collector`).
    common: Vec<(String, String)>,
}

impl Exposition {
    /// Every family declared after this carries `name="value"` first in each sample.
    pub fn with_label(&mut self, name: &str, value: &str) -> &mut Exposition {
        self.common.push((name.to_string(), value.to_string()));
        self
    }

    /// Drops the labels of [`Exposition::with_label`] for the families declared after this.
    pub fn without_labels(&mut self) -> &mut Exposition {
        self.common.clear();
        self
    }

    /// Declares a counter; `name` is the sample name and ends in `_total`.
    pub fn counter(&mut self, name: &str, help: &str, labels: &[&str]) -> &mut Family {
        assert!(name.ends_with("_total"), "{name}: a counter's name ends in _total");
        self.family(name, MetricType::Counter, help, labels)
    }

    /// Declares a gauge.
    pub fn gauge(&mut self, name: &str, help: &str, labels: &[&str]) -> &mut Family {
        self.family(name, MetricType::Gauge, help, labels)
    }

    /// Declares a histogram (samples are [`Value::Histogram`]); `name` without the `_bucket`,
    /// `_sum` and `_count` its samples get.
    pub fn histogram(&mut self, name: &str, help: &str, labels: &[&str]) -> &mut Family {
        self.family(name, MetricType::Histogram, help, labels)
    }

    fn family(&mut self, name: &str, kind: MetricType, help: &str, labels: &[&str]) -> &mut Family {
        let mut names: Vec<String> = self.common.iter().map(|(k, _)| k.clone()).collect();
        names.extend(labels.iter().map(|l| l.to_string()));
        self.families.push(Family {
            name: name.to_string(),
            help: help.to_string(),
            kind,
            labels: names,
            common: self.common.iter().map(|(_, v)| v.clone()).collect(),
            samples: Vec::new(),
        });
        self.families.last_mut().expect("just pushed")
    }

    /// The exposition text (OpenMetrics, ending `# EOF`).
    pub fn encode(self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        let mut text = String::new();
        // Writing into a String does not fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        text
    }

    /// The page as a `200` answer.
    pub fn response(self) -> Response {
        Response::text(CONTENT_TYPE, self.encode())
    }
}

impl Collector for Exposition {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.families {
            // OpenMetrics names a counter's family without `_total`; the encoder adds it back
            // to each sample.
            let name = match f.kind {
                MetricType::Counter => f.name.strip_suffix("_total").unwrap_or(&f.name),
                _ => &f.name,
            };
            let mut family = encoder.encode_descriptor(name, &f.help, None, f.kind)?;
            for (values, v) in &f.samples {
                let labels: Vec<(&str, &str)> = f
                    .labels
                    .iter()
                    .map(String::as_str)
                    .zip(values.iter().map(String::as_str))
                    .collect();
                let sample = family.encode_family(&labels)?;
                match (f.kind, v) {
                    (MetricType::Counter, Value::Int(n)) => ConstCounter::new(*n).encode(sample)?,
                    (MetricType::Counter, Value::Real(x)) => {
                        ConstCounter::new(*x).encode(sample)?
                    }
                    (_, Value::Int(n)) => ConstGauge::new(*n).encode(sample)?,
                    (_, Value::Signed(n)) => ConstGauge::new(*n).encode(sample)?,
                    (_, Value::Real(x)) => ConstGauge::new(*x).encode(sample)?,
                    (_, Value::Histogram { sum, count, buckets }) => {
                        // The library takes each bucket's own observations and sums them.
                        let mut own = Vec::with_capacity(buckets.len() + 1);
                        let mut below = 0;
                        for &(le, n) in buckets {
                            own.push((le, n.saturating_sub(below)));
                            below = n.max(below);
                        }
                        own.push((f64::INFINITY, count.saturating_sub(below)));
                        let mut sample = sample;
                        sample.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                            *sum, *count, &own, None,
                        )?
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_types_labels_and_values_as_scraped() {
        let mut page = Exposition::default();
        page.with_label("agent", r#"sw\1""#);
        page.counter("t_frames_total", "Frames.", &[]).sample::<&str>(&[], 7u64);
        page.gauge("t_flows", "Flows, by port.", &["port"])
            .sample(&["a"], 2u64)
            .sample(&["b"], 0u64);
        page.without_labels();
        page.counter("t_busy_seconds_total", "Busy.", &["stage"]).sample(&["x"], 0.25);
        page.counter("t_none_total", "No samples.", &["reason"]);
        page.gauge("t_expiry", "Expiry.", &[]).sample::<&str>(&[], -5i64);
        page.histogram("t_took_seconds", "Took.", &["route"]).sample(
            &["/m"],
            Value::Histogram { sum: 0.5, count: 3, buckets: vec![(0.1, 1), (1.0, 2)] },
        );
        // The comment lines without their "# ".
        let want = r#"HELP t_frames Frames.
TYPE t_frames counter
t_frames_total{agent="sw\\1\""} 7
HELP t_flows Flows, by port.
TYPE t_flows gauge
t_flows{agent="sw\\1\"",port="a"} 2
t_flows{agent="sw\\1\"",port="b"} 0
HELP t_busy_seconds Busy.
TYPE t_busy_seconds counter
t_busy_seconds_total{stage="x"} 0.25
HELP t_none No samples.
TYPE t_none counter
HELP t_expiry Expiry.
TYPE t_expiry gauge
t_expiry -5
HELP t_took_seconds Took.
TYPE t_took_seconds histogram
t_took_seconds_sum{route="/m"} 0.5
t_took_seconds_count{route="/m"} 3
t_took_seconds_bucket{le="0.1",route="/m"} 1
t_took_seconds_bucket{le="1.0",route="/m"} 2
t_took_seconds_bucket{le="+Inf",route="/m"} 3
EOF
"#;
        let comment = |l: &str| ["HELP ", "TYPE ", "EOF"].iter().any(|p| l.starts_with(p));
        let want: String = want
            .lines()
            .map(|l| if comment(l) { format!("# {l}\n") } else { format!("{l}\n") })
            .collect();
        assert_eq!(page.encode(), want);
    }
}
