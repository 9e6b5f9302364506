//! What the Kubernetes feed publishes: a claim per LB IP and the feed's
//! health. Plain data; the feed (sources/cluster) makes it, the view reads it.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

/// What the cluster says about one LB IP. Its text is shared (`Arc`) by
/// the feed, the table it hands the daemon and the daemon's view: one copy
/// per IP, however many hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRecord {
    /// The node that may announce it; None: nobody (known) does.
    pub owner: Option<Arc<str>>,
    /// Which object said so, in words an operator can look up.
    pub why: Arc<str>,
    /// False while the record may be outdated for want of an answer from
    /// the API (a Lease past its deadline, not yet confirmed). The owner
    /// keeps its permission; "another node owns it" is not trusted.
    pub certain: bool,
    /// The Service that carries the IP (the first, when several share it):
    /// what Kubernetes Events about the IP are attached to.
    pub service: Option<ServiceRef>,
    /// Services share the IP and their records name different nodes.
    pub split: Option<Arc<guard_wire::api::SplitElection>>,
}

/// namespace/name of a Service (shared with the feed's keys, not copied).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ServiceRef {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

impl std::fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One stream's health, as shown in the status and metrics (a wire type).
pub use guard_wire::status::StreamStatus;

/// The claims as the feed hands them to the daemon: every LB IP's current
/// claim, and a log of which IPs changed at which version, so that one
/// event costs the daemon the IPs it touched, not all of them. The feed
/// writes it; the daemon only reads (what it has seen is its own: the
/// version it last read), so the hand-off goes one way.
#[derive(Debug, Default)]
pub struct OwnerTable {
    pub owners: BTreeMap<IpAddr, Arc<OwnerRecord>>,
    /// The version of the last change written (0: none yet).
    pub version: u64,
    /// (version, IP) of the latest changes, oldest first, at most
    /// [`CHANGE_LOG`]: a reader further behind derives everything anew.
    log: std::collections::VecDeque<(u64, IpAddr)>,
    /// The newest version any of whose changes left the log (0: none): a
    /// reader that saw less than it would miss them. Versions leave the log
    /// one IP at a time, so its first entry does not tell.
    trimmed: u64,
}

/// Changes the log keeps (about 32 bytes each): a daemon that falls this
/// far behind derives the whole view, as at start.
pub const CHANGE_LOG: usize = 16_384;

impl OwnerTable {
    /// A new version in which `changed` took their current claims.
    pub fn record(&mut self, changed: impl IntoIterator<Item = IpAddr>) {
        self.version += 1;
        for ip in changed {
            if self.log.len() == CHANGE_LOG {
                if let Some((v, _)) = self.log.pop_front() {
                    self.trimmed = v;
                }
            }
            self.log.push_back((self.version, ip));
        }
    }

    /// The IPs changed after version `seen`; None when the log no longer
    /// reaches back that far (derive everything).
    pub fn changed_since(&self, seen: u64) -> Option<BTreeSet<IpAddr>> {
        if seen >= self.version {
            return Some(BTreeSet::new());
        }
        // A change after `seen` has left the log: it cannot say them all.
        if self.trimmed > seen {
            return None;
        }
        let from = self.log.partition_point(|(v, _)| *v <= seen);
        Some(self.log.range(from..).map(|(_, ip)| *ip).collect())
    }
}

/// One [`OwnerTable`], shared by the feed (which writes it) and the daemon
/// (which reads it); clones share it.
#[derive(Debug, Clone, Default)]
pub struct SharedOwners(Arc<Mutex<OwnerTable>>);

impl SharedOwners {
    pub fn lock(&self) -> MutexGuard<'_, OwnerTable> {
        // A panic while holding it leaves plain data, still consistent per entry.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A copy of every claim (tests).
    #[cfg(test)]
    pub fn snapshot(&self) -> BTreeMap<IpAddr, OwnerRecord> {
        (self.lock().owners.iter())
            .map(|(ip, c)| (*ip, OwnerRecord::clone(c)))
            .collect()
    }
}

/// What the cluster says, as published to the daemon.
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    /// Empty until every stream has completed its first list, so that an
    /// announcer that lists late cannot be overruled by one that listed early.
    pub owners: SharedOwners,
    /// Bumped whenever `claims` changed (what equality compares).
    pub owners_version: u64,
    /// Every watcher has completed its first list.
    pub synced: bool,
    /// The guard has been blind for longer than the threshold.
    pub degraded: bool,
    /// Every holder of a Lease in use and every announcing node (to spot a
    /// node name that matches none of them).
    pub holders: BTreeSet<String>,
    /// When the change that produced this view reached the guard.
    pub event_at: Option<Instant>,
    /// Since when the guard has been blind (None: it sees).
    pub failing_since: Option<Instant>,
    /// Per stream.
    pub streams: Vec<StreamStatus>,
    /// Leases in use past their deadline that the API has not confirmed.
    pub unconfirmed: usize,
    /// Blind this long, the view degrades.
    pub threshold: Duration,
    /// The guard cannot read the API for a reason of its own (its token,
    /// its permissions, its trust in the server), with what to fix; the
    /// daemon is not ready while this lasts.
    pub problem: Option<String>,
}

impl PartialEq for ClusterView {
    fn eq(&self, o: &Self) -> bool {
        self.owners_version == o.owners_version
            && self.synced == o.synced
            && self.degraded == o.degraded
            && self.holders == o.holders
            && self.streams == o.streams
            && self.unconfirmed == o.unconfirmed
            && self.failing_since.is_some() == o.failing_since.is_some()
            && self.threshold == o.threshold
            && self.problem == o.problem
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader gets every IP changed since what it saw, however many
    /// versions it missed, until the log no longer reaches back: then it is
    /// told to derive everything.
    #[test]
    fn the_change_log_says_what_changed_since_a_version_or_that_it_cannot() {
        let ip = |n: u8| IpAddr::from([198, 51, 100, n]);
        let mut t = OwnerTable::default();
        assert_eq!(t.changed_since(0), Some(BTreeSet::new()));
        t.record([ip(1)]);
        t.record([ip(2), ip(3)]);
        t.record([]);
        assert_eq!(t.version, 3);
        assert_eq!(t.changed_since(0), Some([ip(1), ip(2), ip(3)].into()));
        assert_eq!(t.changed_since(1), Some([ip(2), ip(3)].into()));
        assert_eq!(t.changed_since(3), Some(BTreeSet::new()));
        for i in 0..CHANGE_LOG {
            t.record([ip((i % 200) as u8)]);
        }
        assert_eq!(t.changed_since(1), None, "pushed out of the log");
        assert!(t.changed_since(t.version - 5).is_some_and(|s| s.len() == 5));
    }

    /// A version whose changes left the log only in part is not reported
    /// as complete: the reader that saw the version before it derives
    /// everything (else an IP that moved here would wait for the resync).
    #[test]
    fn a_version_partly_out_of_the_log_sends_its_reader_to_derive_everything() {
        let ip = |n: u32| IpAddr::from((0xCB00_7100u32 + n).to_be_bytes()); // 203.0.113.n
        let mut t = OwnerTable::default();
        t.record([ip(1)]); // 1
        t.record([ip(2), ip(3)]); // 2
        for i in 0..CHANGE_LOG - 2 {
            t.record([ip(10 + (i % 200) as u32)]);
        }
        // Version 1 is gone; version 2 whole: a reader at 1 still gets all.
        assert!(t.changed_since(1).is_some_and(|s| s.contains(&ip(2))));
        t.record([ip(9)]);
        // Version 2 lost ip(2) and kept ip(3): a reader at 1 would miss ip(2).
        assert_eq!(t.changed_since(1), None, "version 2 is no longer whole");
        assert!(t.changed_since(2).is_some());
    }

    /// One change of more IPs than the log keeps (a relist after an outage
    /// on a large cluster) cannot be read as a short list.
    #[test]
    fn a_change_larger_than_the_log_sends_every_reader_to_derive_everything() {
        let mut t = OwnerTable::default();
        t.record([IpAddr::from([198, 51, 100, 1])]);
        t.record((0..CHANGE_LOG as u32 + 1).map(|n| IpAddr::from((0x0A00_0000 + n).to_be_bytes())));
        assert_eq!(t.changed_since(0), None);
        assert_eq!(t.changed_since(1), None);
        assert_eq!(t.changed_since(2), Some(BTreeSet::new()));
    }
}
