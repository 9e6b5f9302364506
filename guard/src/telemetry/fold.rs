//! Which kernel counter rows keep their own `lb_ip` label in /metrics
//! (`--metrics-max-ip-series`), and what the folded rest adds up to.

use super::{
    counters::{Row, Snapshot},
    family::Labels,
};

/// Which counter rows keep their own `lb_ip` in /metrics, and what the
/// folded rest has added up to. Chosen first come, first labelled, and
/// stable: a labelled row stays labelled and a folded one stays folded until
/// its IP's rows are reclaimed, so no series flaps and `lb_ip="other"` only
/// grows (it adds each folded row's increase), as a counter must. Passed
/// frames may take at most three quarters of the labels: rows of frames
/// stopped (what alerts need) always find room.
#[derive(Debug, Default)]
pub struct Fold {
    labelled: std::collections::HashSet<guard_common::CounterKey>,
    labelled_passed: usize,
    /// Folded rows and the value last added to `other`.
    folded: std::collections::HashMap<guard_common::CounterKey, u64>,
    other: std::collections::BTreeMap<Labels, u64>,
}

impl Fold {
    /// The per-IP series for this scrape, and how many rows are folded.
    pub(super) fn series(&mut self, snap: &Snapshot, max: usize) -> (Vec<(Labels, u64)>, usize) {
        let present: std::collections::HashSet<_> = snap.rows.iter().map(|r| r.key).collect();
        let passed = guard_common::Verdict::Passed as u8;
        // Reclaimed rows give their label back.
        let before = self.labelled.len();
        self.labelled.retain(|k| present.contains(k));
        if self.labelled.len() != before {
            self.labelled_passed = self.labelled.iter().filter(|k| k.verdict == passed).count();
        }
        self.folded.retain(|k, _| present.contains(k));
        let labels = |r: &Row, ip: Option<String>| -> Labels {
            let l = r.labels();
            vec![
                ("lb_ip", ip.unwrap_or(l.lb_ip)),
                ("family", l.family),
                ("interface", l.interface),
                ("kind", l.kind),
                ("origin", l.origin),
                ("state", l.state),
                ("verdict", l.verdict),
            ]
        };
        let mut out = Vec::new();
        for r in &snap.rows {
            if !self.labelled.contains(&r.key) && !self.folded.contains_key(&r.key) {
                let is_passed = r.key.verdict == passed;
                let room = self.labelled.len() < max
                    && (!is_passed || self.labelled_passed < max - max / 4);
                if room {
                    self.labelled.insert(r.key);
                    self.labelled_passed += usize::from(is_passed);
                } else {
                    self.folded.insert(r.key, 0);
                }
            }
            if self.labelled.contains(&r.key) {
                out.push((labels(r, None), r.value.packets));
            } else if let Some(last) = self.folded.get_mut(&r.key) {
                let grown = r.value.packets.saturating_sub(*last);
                *last = r.value.packets.max(*last);
                *self
                    .other
                    .entry(labels(r, Some("other".into())))
                    .or_default() += grown;
            }
        }
        out.extend(self.other.iter().map(|(l, v)| (l.clone(), *v)));
        (out, self.folded.len())
    }
}

#[cfg(test)]
mod tests {
    use super::{Fold, Labels};
    use crate::telemetry::counters::{Row, Snapshot};
    use guard_common::{CounterKey, CounterValue};

    fn row(ip: u32, verdict: u8, packets: u64) -> Row {
        Row {
            key: CounterKey {
                ip: guard_common::v4_key(ip),
                ifindex: 0,
                kind: 0,
                origin: 0,
                state: 1,
                verdict,
            },
            value: CounterValue { packets, bytes: 0 },
        }
    }

    fn value(series: &[(Labels, u64)], ip: &str) -> Option<u64> {
        series
            .iter()
            .filter(|(l, _)| l[0].1 == ip)
            .map(|(_, v)| *v)
            .reduce(|a, b| a + b)
    }

    /// Labels are given first come and kept; the folded rest only grows,
    /// also when a folded row goes away or a busier row appears.
    #[test]
    fn folding_is_stable_and_monotonic() {
        let mut f = Fold::default();
        let snap = |rows: Vec<Row>| Snapshot {
            rows,
            stats: Default::default(),
        };
        // Two labels at most; rows are "dropped" (verdict 1).
        let (s, folded) = f.series(&snap(vec![row(1, 1, 5), row(2, 1, 5), row(3, 1, 5)]), 2);
        assert_eq!(folded, 1);
        assert_eq!(value(&s, "0.0.0.3"), None, "folded");
        assert_eq!(value(&s, "other"), Some(5));
        // IP 3 gets much busier: it stays folded; "other" grows by its increase.
        let (s, _) = f.series(&snap(vec![row(1, 1, 6), row(2, 1, 6), row(3, 1, 500)]), 2);
        assert_eq!(value(&s, "0.0.0.1"), Some(6));
        assert_eq!(value(&s, "other"), Some(500));
        // IP 3's rows are reclaimed: "other" does not go down.
        let (s, folded) = f.series(&snap(vec![row(1, 1, 7), row(2, 1, 7)]), 2);
        assert_eq!((value(&s, "other"), folded), (Some(500), 0));
        // IP 2's rows are reclaimed: its label goes to the next newcomer.
        let (s, _) = f.series(&snap(vec![row(1, 1, 8), row(4, 1, 1)]), 2);
        assert_eq!(value(&s, "0.0.0.4"), Some(1));
        assert_eq!(value(&s, "0.0.0.2"), None);
        // Passed rows (verdict 0) may not take the last quarter of the labels.
        let mut f = Fold::default();
        let rows: Vec<Row> = (1..=4)
            .map(|i| row(i, 0, 1))
            .chain([row(9, 1, 1)])
            .collect();
        let (s, folded) = f.series(&snap(rows), 4);
        assert_eq!(
            value(&s, "0.0.0.9"),
            Some(1),
            "a stopped frame keeps its label"
        );
        assert_eq!(folded, 1);
        // With 0, nothing is labelled.
        let (s, folded) = Fold::default().series(&snap(vec![row(1, 1, 2), row(2, 0, 3)]), 0);
        assert_eq!((s.len(), folded), (2, 2));
        assert_eq!(value(&s, "other"), Some(5));
    }
}
