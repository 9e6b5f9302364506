//! A metric family as one scrape holds it, before prometheus-client
//! encodes it: a name, its help, and its series.

/// A series' labels.
pub(super) type Labels = Vec<(&'static str, String)>;

/// (name, help, series).
pub(super) type Family<V> = (&'static str, &'static str, Vec<(Labels, V)>);

/// One scrape's worth of values.
#[derive(Debug, Default)]
pub(super) struct Values {
    pub(super) counters: Vec<Family<u64>>,
    pub(super) gauges: Vec<Family<f64>>,
    pub(super) histograms: Vec<Family<super::histogram::Histogram>>,
}
