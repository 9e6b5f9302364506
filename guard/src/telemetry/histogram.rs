//! A Prometheus histogram kept by hand: fixed bucket bounds, cumulative
//! counts rendered at scrape time (`metrics.rs`).

/// Bounds (seconds) for times around a move: from a re-sent announcement
/// (milliseconds) to a client that keeps a stale cache for minutes.
pub const SECONDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative); the last one is +Inf.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new(SECONDS)
    }
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, v: f64) {
        let i = self.bounds.iter().position(|b| v <= *b);
        self.counts[i.unwrap_or(self.bounds.len())] += 1;
        self.sum += v;
        self.count += 1;
    }

    pub fn sum(&self) -> f64 {
        self.sum
    }

    pub fn count(&self) -> u64 {
        self.count
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
        assert_eq!(h.count(), 4);
        assert!((h.sum() - 7.65).abs() < 1e-9);
    }
}
