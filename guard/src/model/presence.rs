//! Presence (pure): every guard publishes who it is — its node, the guarded
//! interfaces and their MACs, its mode, version and health — as a
//! coordination.k8s.io Lease `arp-guard-<node>` in its own namespace, and
//! reads everyone's. The record and its bounds are `guard_wire::presence`
//! (the plugin reads them too); this module holds the Lease's name and
//! body, and the table node -> record every guard keeps: what
//! names the node behind a MAC (the census's rogue), which nodes of the
//! cluster run no guard (coverage), and the owner's MAC where a part needs
//! it with certainty.

use std::collections::{BTreeMap, BTreeSet};

use super::fmt_mac;
use guard_wire::presence::MAX_NAME;
/// The record and its bounds (a wire type: the plugin reads the records).
pub use guard_wire::presence::{parse_mac, Iface, Record, ANNOTATION, LABEL, LABEL_VALUE};

/// At most this many records are kept (a cluster of 5,000 nodes has 5,000).
pub const MAX_RECORDS: usize = 10_000;

/// The Lease's name for `node`: `arp-guard-<node>`, lower-cased, every
/// character a Kubernetes name does not allow turned into `-`, at most 253
/// characters; a name changed by this gets a hash of the original, so that
/// two node names never share a Lease.
pub fn lease_name(node: &str) -> String {
    let clean: String = node
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-' | '.') => c,
            _ => '-',
        })
        .collect();
    let mut name = format!("arp-guard-{}", clean.trim_matches(|c| c == '-' || c == '.'));
    if clean != node || name.len() > MAX_NAME {
        // FNV-1a: stable across builds and machines.
        let h = node.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        name.truncate(MAX_NAME - 17);
        name = format!("{}-{h:016x}", name.trim_end_matches(['-', '.']));
    }
    name
}

/// One node's record as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub record: Record,
    /// When its guard last wrote it (`spec.renewTime`, Unix seconds; 0:
    /// unset): a record is written when its content changes, not renewed.
    pub written_unix: i64,
}

/// Every guard's record, by node, as the records' watch last delivered it,
/// and which nodes' guards are alive: a record says who a guard is, its
/// Pod's Ready condition whether it is still there. Liveness comes from a
/// signal the cluster already pays for and that changes only when
/// something changes (the kubelet's readiness probe, written to the API
/// only when its result flips): a renewal of every record every period,
/// read by every guard, is N^2 for the API server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    pub nodes: BTreeMap<String, Entry>,
    /// Presence Leases that could not be read (malformed, too large, a
    /// record in another node's Lease, past [`MAX_RECORDS`]), by Lease name.
    pub bad: BTreeMap<String, String>,
    /// The nodes whose guard Pod is Ready (None: the Pods cannot be read;
    /// then every record counts as live, and `/cluster` says why).
    pub ready: Option<BTreeSet<String>>,
}

/// What the presence task last saw, as it publishes it.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Where the records live.
    pub namespace: String,
    /// Every record, as last delivered (kept while the API cannot be read).
    pub table: std::sync::Arc<Table>,
    /// When the records and the Pods were last known current (Unix seconds:
    /// their lists done, or a watch's sign of progress); None: not yet.
    pub read_unix: Option<i64>,
    /// The cluster's nodes (None: not read yet; Err: why they cannot be read).
    pub nodes: Option<Result<Vec<String>, String>>,
    /// When the nodes were last read (Unix seconds).
    pub nodes_unix: Option<i64>,
    /// This guard's own record is in the API as it is now.
    pub published: bool,
    /// The failing requests (`write`, `records`, `pods`, `nodes`) and their errors.
    pub errors: BTreeMap<String, String>,
}

/// A coverage count older than this is not exported: only the guard that
/// keeps coverage reads the Nodes on a timer (every 10 minutes); another
/// guard's read, made for someone who asked, would go stale.
pub const UNCOVERED_FRESH_S: i64 = 900;

impl Seen {
    /// The cluster's nodes without a live guard (None: the Nodes were not
    /// read, or cannot be).
    pub fn uncovered(&self) -> Option<Vec<String>> {
        let Some(Ok(nodes)) = &self.nodes else {
            return None;
        };
        Some(
            (nodes.iter())
                .filter(|n| !self.table.is_live(n))
                .cloned()
                .collect(),
        )
    }
}

/// Who a MAC is, as the presence records tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Whose {
    /// A live guard's node has it on this interface.
    Node { node: String, interface: String },
    /// No live guard lists it: a device outside the cluster, or a node without the guard.
    Outside,
}

impl Table {
    /// Insert the record of Lease `lease`; false when the table is full.
    pub fn insert(&mut self, lease: &str, e: Entry) -> bool {
        if self.nodes.len() >= MAX_RECORDS && !self.nodes.contains_key(&e.record.node) {
            self.bad
                .insert(lease.to_owned(), format!("past {MAX_RECORDS} records"));
            return false;
        }
        self.bad.remove(lease);
        self.nodes.insert(e.record.node.clone(), e);
        true
    }

    /// Lease `lease` could not be read: whatever it held before is gone.
    pub fn reject(&mut self, lease: &str, why: String) {
        self.remove(lease);
        if self.bad.len() < MAX_RECORDS || self.bad.contains_key(lease) {
            self.bad.insert(lease.to_owned(), why);
        }
    }

    /// Lease `lease` was deleted.
    pub fn remove(&mut self, lease: &str) {
        self.bad.remove(lease);
        self.nodes.retain(|node, _| lease_name(node) != lease);
    }

    /// Leases skipped (malformed, too large, forged, past the bound).
    pub fn skipped(&self) -> usize {
        self.bad.len()
    }

    /// `node` has a record and its guard's Pod is Ready (or the Pods
    /// cannot be read).
    pub fn is_live(&self, node: &str) -> bool {
        self.nodes.contains_key(node) && self.ready.as_ref().is_none_or(|r| r.contains(node))
    }

    fn live_entries(&self) -> impl Iterator<Item = (&String, &Entry)> {
        self.nodes.iter().filter(|(n, _)| self.is_live(n))
    }

    /// MAC -> (node, interface) of every live record.
    pub fn macs(&self) -> BTreeMap<[u8; 6], (String, String)> {
        let mut out = BTreeMap::new();
        for (node, e) in self.live_entries() {
            for i in &e.record.interfaces {
                if let Some(mac) = parse_mac(&i.mac) {
                    out.insert(mac, (node.clone(), i.name.clone()));
                }
            }
        }
        out
    }

    /// The nodes with a live record whose kernel answers ARP for LB IPs
    /// they do not own ([`Record::kernel_answers`]).
    pub fn kernel_answering(&self) -> BTreeSet<String> {
        self.live_entries()
            .filter(|(_, e)| e.record.kernel_answers)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The nodes with a live record.
    pub fn live(&self) -> Vec<String> {
        self.live_entries().map(|(n, _)| n.clone()).collect()
    }

    /// The MACs of `node`'s other interfaces (not uplinks), by MAC (empty: no live
    /// record, or none listed).
    pub fn other_macs_of(&self, node: &str) -> BTreeMap<[u8; 6], String> {
        (self
            .nodes
            .get(node)
            .filter(|_| self.is_live(node))
            .into_iter())
        .flat_map(|e| &e.record.other)
        .filter_map(|i| Some((parse_mac(&i.mac)?, i.name.clone())))
        .collect()
    }

    /// The MACs of `node`'s live record (None: no live record).
    pub fn macs_of(&self, node: &str) -> Option<BTreeSet<[u8; 6]>> {
        let e = self.nodes.get(node).filter(|_| self.is_live(node))?;
        Some(
            (e.record.interfaces.iter())
                .filter_map(|i| parse_mac(&i.mac))
                .collect(),
        )
    }
}

/// One guard Pod as the presence task reads it: the node it runs on and
/// whether it is Ready and not being deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardPod {
    pub node: String,
    pub ready: bool,
}

/// The guard Pods, by Pod name (a node has two during a rolling update: the
/// old one terminating, the new one starting).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuardPods {
    pub pods: BTreeMap<String, GuardPod>,
}

impl GuardPods {
    /// A Pod added or changed; false when the table is full.
    pub fn apply(&mut self, name: &str, pod: GuardPod) -> bool {
        if self.pods.len() >= 2 * MAX_RECORDS && !self.pods.contains_key(name) {
            return false;
        }
        self.pods.insert(name.to_owned(), pod);
        true
    }

    pub fn remove(&mut self, name: &str) {
        self.pods.remove(name);
    }

    /// The nodes with a Ready guard Pod.
    pub fn ready_nodes(&self) -> BTreeSet<String> {
        (self.pods.values())
            .filter(|p| p.ready)
            .map(|p| p.node.clone())
            .collect()
    }
}

/// Who `mac` is, from `macs` ([`Table::macs`]).
pub fn whose(macs: &BTreeMap<[u8; 6], (String, String)>, mac: &[u8; 6]) -> Whose {
    match macs.get(mac) {
        Some((node, interface)) => Whose::Node {
            node: node.clone(),
            interface: interface.clone(),
        },
        None => Whose::Outside,
    }
}

/// The words for a claimant in logs and events: `node-b (eth0, 02:..)`, or
/// the MAC said to belong to no guarded node.
pub fn describe(w: &Whose, mac: &[u8; 6]) -> String {
    match w {
        Whose::Node { node, interface } => format!("{node} ({interface}, {})", fmt_mac(mac)),
        Whose::Outside => format!(
            "{} (not a guarded node: a device outside the cluster or a node without the guard)",
            fmt_mac(mac)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use guard_wire::presence::MAX_RECORD_BYTES;

    fn record(node: &str, macs: &[&str]) -> Record {
        Record {
            node: node.into(),
            mode: "enforce".into(),
            version: "1".into(),
            health: "enforcing".into(),
            interfaces: macs
                .iter()
                .map(|m| Iface {
                    name: "eth0".into(),
                    mac: (*m).into(),
                })
                .collect(),
            other: vec![],
            kernel_answers: false,
        }
    }

    #[test]
    fn unguarded_interfaces_go_first_when_a_record_is_too_long() {
        let mut r = record("node-a", &["02:00:00:00:00:0a"]);
        r.other = (0..40)
            .map(|i| Iface {
                name: format!("{i}-{}", "x".repeat(100)),
                mac: "02:00:00:00:00:0b".into(),
            })
            .collect();
        let text = r.encode();
        assert!(text.len() <= MAX_RECORD_BYTES);
        let back = Record::decode(Some(&text)).unwrap();
        assert_eq!(back.interfaces, r.interfaces);
        assert!(!back.other.is_empty() && back.other.len() < 32);
        let mut t = Table::default();
        t.insert(
            "arp-guard-node-a",
            Entry {
                record: back,
                written_unix: 100,
            },
        );
        assert_eq!(t.other_macs_of("node-a").len(), 1);
        assert_eq!(t.live(), ["node-a"]);
        // Its Pod not Ready: not live, and nothing of it is used.
        t.ready = Some(BTreeSet::new());
        assert!(t.live().is_empty() && t.other_macs_of("node-a").is_empty());
    }

    #[test]
    fn lease_names_are_valid_bounded_and_distinct() {
        assert_eq!(lease_name("node-a"), "arp-guard-node-a");
        let a = lease_name("Node_A");
        let b = lease_name("node-a");
        assert_ne!(a, b);
        assert!(a.starts_with("arp-guard-node-a-"));
        let long = lease_name(&"n".repeat(300));
        assert!(long.len() <= MAX_NAME, "{}", long.len());
        assert!(long
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'));
    }

    #[test]
    fn macs_of_live_records_name_their_node_and_not_ready_ones_do_not() {
        let mut t = Table::default();
        for (node, mac) in [
            ("node-a", "02:00:00:00:00:0a"),
            ("node-b", "02:00:00:00:00:0b"),
        ] {
            t.insert(
                &lease_name(node),
                Entry {
                    record: record(node, &[mac]),
                    written_unix: 100,
                },
            );
        }
        // node-b's guard Pod is not Ready (its guard was killed).
        let mut pods = GuardPods::default();
        for (pod, node, ready) in [("g-1", "node-a", true), ("g-2", "node-b", false)] {
            pods.apply(
                pod,
                GuardPod {
                    node: node.into(),
                    ready,
                },
            );
        }
        t.ready = Some(pods.ready_nodes());
        let macs = t.macs();
        let a = parse_mac("02:00:00:00:00:0a").unwrap();
        let b = parse_mac("02:00:00:00:00:0b").unwrap();
        assert_eq!(
            describe(&whose(&macs, &a), &a),
            "node-a (eth0, 02:00:00:00:00:0a)"
        );
        assert_eq!(
            whose(&macs, &b),
            Whose::Outside,
            "node-b's guard is not Ready"
        );
        assert!(describe(&Whose::Outside, &b).contains("not a guarded node"));
        assert_eq!(t.macs_of("node-a"), Some(BTreeSet::from([a])));
        assert_eq!(t.macs_of("node-b"), None);
        // A new Pod on node-b is Ready (a restart): live again.
        pods.apply(
            "g-3",
            GuardPod {
                node: "node-b".into(),
                ready: true,
            },
        );
        t.ready = Some(pods.ready_nodes());
        assert_eq!(t.live(), ["node-a", "node-b"]);
        // Its Lease deleted (a clean exit): gone, whatever its Pod says.
        t.remove(&lease_name("node-b"));
        assert_eq!(t.live(), ["node-a"]);
    }

    #[test]
    fn the_table_is_bounded() {
        let mut t = Table::default();
        for i in 0..MAX_RECORDS + 5 {
            let node = format!("n{i}");
            t.insert(
                &lease_name(&node),
                Entry {
                    record: record(&node, &[]),
                    written_unix: 0,
                },
            );
        }
        assert_eq!((t.nodes.len(), t.skipped()), (MAX_RECORDS, 5));
        // A bad Lease fixed later is read; one deleted is forgotten.
        t.reject("arp-guard-x", "malformed".into());
        assert_eq!(t.skipped(), 6);
        t.remove("arp-guard-x");
        assert_eq!(t.skipped(), 5);
        let mut pods = GuardPods::default();
        for i in 0..2 * MAX_RECORDS + 3 {
            pods.apply(
                &format!("p{i}"),
                GuardPod {
                    node: format!("n{i}"),
                    ready: true,
                },
            );
        }
        assert_eq!(pods.pods.len(), 2 * MAX_RECORDS);
    }
}
