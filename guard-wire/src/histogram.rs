//! A Prometheus histogram kept by hand: fixed bucket bounds, per-bucket
//! counts, rendered cumulatively at the daemon's scrape time; the same
//! value travels in the API's documents (the clients' failover times), so
//! a reader of them decodes this type.

use serde::{Deserialize, Serialize};

/// Bounds (seconds) for times around a takeover: from a re-sent
/// announcement (milliseconds) to an announcer that speaks minutes late.
pub const SECONDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Bounds (seconds) of a client's failover time: a Linux client's
/// re-resolution (about a second), a switch's FDB ageing (300 s), a
/// router's ARP cache (up to 4 h on some).
pub const FAILOVER_SECONDS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0, 14400.0,
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    pub bounds: Vec<f64>,
    /// Observations per bucket (not cumulative); the last one is +Inf.
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new(SECONDS)
    }
}

impl Histogram {
    pub fn new(bounds: &[f64]) -> Self {
        Histogram {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, v: f64) {
        let i = self.bounds.iter().position(|b| v <= *b);
        if let Some(c) = self.counts.get_mut(i.unwrap_or(self.bounds.len())) {
            *c += 1;
        }
        self.sum += v;
        self.count += 1;
    }

    /// (upper bound, cumulative count) per bucket, +Inf last.
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        let mut acc = 0;
        self.bounds
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(&self.counts)
            .map(|(b, n)| {
                acc += n;
                (b, acc)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative() {
        let mut h = Histogram::new(&[0.1, 1.0]);
        for v in [0.05, 0.1, 0.5, 7.0] {
            h.observe(v);
        }
        assert_eq!(h.buckets(), vec![(0.1, 2), (1.0, 3), (f64::INFINITY, 4)]);
        assert_eq!(h.count, 4);
        assert!((h.sum - 7.65).abs() < 1e-9);
    }

    #[test]
    fn buckets_take_what_is_at_or_below_their_bound() {
        let mut h = Histogram::new(FAILOVER_SECONDS);
        for v in [0.05, 0.1, 3.0, 99_999.0] {
            h.observe(v);
        }
        assert_eq!((h.counts[0], h.counts[1], h.count), (2, 0, 4));
        assert_eq!(h.counts[FAILOVER_SECONDS.len()], 1, "+Inf");
        assert_eq!(h.counts[5], 1, "3 s in the 5 s bucket");
    }
}
