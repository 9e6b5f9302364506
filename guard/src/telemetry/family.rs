//! A metric family as one scrape holds it, before prometheus-client
//! encodes it: a name, its help, and its series.

/// A series' labels.
pub(super) type Labels = Vec<(&'static str, String)>;

/// (name, help, series).
pub(super) type Family<V> = (&'static str, &'static str, Vec<(Labels, V)>);
