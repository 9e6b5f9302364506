//! Presence (pure): every guard publishes who it is — its node, the guarded
//! interfaces and their MACs, its mode, version and health — as a
//! coordination.k8s.io Lease `arp-guard-<node>` in its own namespace, and
//! reads everyone's. This module holds the record, its bounds, the Lease's
//! name and body, and the table node -> record every guard keeps: what
//! names the node behind a MAC (the census's rogue), which nodes of the
//! cluster run no guard (coverage), and the owner's MAC where a part needs
//! it with certainty.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::fmt_mac;

/// The label every presence Lease carries (what the guards list by).
pub const LABEL: &str = "app.kubernetes.io/component";
pub const LABEL_VALUE: &str = "arp-guard-presence";
/// The annotation holding the record (JSON).
pub const ANNOTATION: &str = "arp-guard.io/presence";
/// Longest record accepted or written, in bytes of its JSON: a huge or
/// hostile Lease costs its reader at most this much once parsed.
pub const MAX_RECORD_BYTES: usize = 4096;
/// At most this many records are kept (a cluster of 5,000 nodes has 5,000).
pub const MAX_RECORDS: usize = 10_000;
/// At most this many interfaces per record (longer lists are cut).
pub const MAX_INTERFACES: usize = 32;
/// Longest node name kept from a record (a Kubernetes name is at most 253).
const MAX_NAME: usize = 253;

/// One uplink of a node, and its MAC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Iface {
    pub name: String,
    /// `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
}

/// What a guard says of itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub node: String,
    /// `enforce` or `monitor`.
    pub mode: String,
    pub version: String,
    /// `enforcing`, `monitoring`, or `degraded` (not ready: see its /readyz).
    pub health: String,
    pub interfaces: Vec<Iface>,
    /// The node's other physical interfaces and their MACs (not guarded): an
    /// owner answering from one of them is on the wrong interface.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other: Vec<Iface>,
    /// Its kernel answered ARP for an LB IP another node owns, held on an
    /// interface other than the one it answered on (arp_ignore=0: kube-proxy
    /// IPVS with strictARP off), and the guard did not stop it (monitor
    /// mode), lately (`model::kube_events::kernel`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kernel_answers: bool,
}

/// Why a presence Lease was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bad {
    /// No presence annotation.
    Missing,
    /// Its record is longer than [`MAX_RECORD_BYTES`].
    TooLarge(usize),
    /// Not a record (with serde's reason).
    Malformed(String),
}

impl std::fmt::Display for Bad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bad::Missing => write!(f, "no {ANNOTATION} annotation"),
            Bad::TooLarge(n) => write!(f, "record of {n} bytes (at most {MAX_RECORD_BYTES})"),
            Bad::Malformed(e) => write!(f, "malformed record: {e}"),
        }
    }
}

impl Record {
    /// The annotation's text, cut to its bounds (interfaces beyond
    /// [`MAX_INTERFACES`], then beyond the byte bound, are left out).
    pub fn encode(&self) -> String {
        let mut r = self.clone();
        r.interfaces.truncate(MAX_INTERFACES);
        r.other.truncate(MAX_INTERFACES);
        loop {
            let text = serde_json::to_string(&r).unwrap_or_default();
            if text.len() <= MAX_RECORD_BYTES || (r.interfaces.is_empty() && r.other.is_empty()) {
                return text;
            }
            // The unguarded ones go first: the guarded ones name the node.
            if r.other.pop().is_none() {
                r.interfaces.pop();
            }
        }
    }

    /// A record from an annotation's text, checked against its bounds.
    pub fn decode(text: Option<&str>) -> Result<Record, Bad> {
        let text = text.ok_or(Bad::Missing)?;
        if text.len() > MAX_RECORD_BYTES {
            return Err(Bad::TooLarge(text.len()));
        }
        let r: Record = serde_json::from_str(text).map_err(|e| Bad::Malformed(e.to_string()))?;
        if r.node.is_empty()
            || r.node.len() > MAX_NAME
            || r.interfaces.len() > MAX_INTERFACES
            || r.other.len() > MAX_INTERFACES
        {
            return Err(Bad::Malformed(
                "node name or interface count out of bounds".into(),
            ));
        }
        if let Some(i) = (r.interfaces.iter().chain(&r.other)).find(|i| parse_mac(&i.mac).is_none())
        {
            return Err(Bad::Malformed(format!("not a MAC: {:?}", i.mac)));
        }
        Ok(r)
    }
}

/// `aa:bb:cc:dd:ee:ff` to bytes.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut out {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(out)
}

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

/// One node's record as read, with its Lease's times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub record: Record,
    /// `spec.renewTime` (Unix seconds; 0: unset).
    pub renew_unix: i64,
    /// `spec.leaseDurationSeconds`.
    pub duration_s: i64,
}

impl Entry {
    /// Not renewed within its duration: its guard is gone (or cut off).
    pub fn expired(&self, now_unix: i64) -> bool {
        self.renew_unix.saturating_add(self.duration_s) < now_unix
    }
}

/// Every guard's record, by node, as last read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    pub nodes: BTreeMap<String, Entry>,
    /// Leases skipped as malformed, too large, or past [`MAX_RECORDS`].
    pub skipped: usize,
}

/// What the presence task last saw, as it publishes it.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Where the records live.
    pub namespace: String,
    /// Every record, as last listed (kept while the API cannot be read).
    pub table: std::sync::Arc<Table>,
    /// When the records were last listed (Unix seconds).
    pub read_unix: Option<i64>,
    /// The cluster's nodes (None: not read yet; Err: why they cannot be read).
    pub nodes: Option<Result<Vec<String>, String>>,
    /// This guard's own record was written at least once.
    pub published: bool,
    /// The failing requests (`write`, `list`, `nodes`) and their errors.
    pub errors: BTreeMap<String, String>,
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
    /// Insert a record read from a Lease; false when the table is full.
    pub fn insert(&mut self, e: Entry) -> bool {
        if self.nodes.len() >= MAX_RECORDS && !self.nodes.contains_key(&e.record.node) {
            self.skipped += 1;
            return false;
        }
        self.nodes.insert(e.record.node.clone(), e);
        true
    }

    /// MAC -> (node, interface) of every live record.
    pub fn macs(&self, now_unix: i64) -> BTreeMap<[u8; 6], (String, String)> {
        let mut out = BTreeMap::new();
        for (node, e) in self.nodes.iter().filter(|(_, e)| !e.expired(now_unix)) {
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
    pub fn kernel_answering(&self, now_unix: i64) -> BTreeSet<String> {
        (self.nodes.iter())
            .filter(|(_, e)| !e.expired(now_unix) && e.record.kernel_answers)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The nodes with a live record.
    pub fn live(&self, now_unix: i64) -> Vec<String> {
        (self.nodes.iter())
            .filter(|(_, e)| !e.expired(now_unix))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The MACs of `node`'s other interfaces (not uplinks), by MAC (empty: no live
    /// record, or none listed).
    pub fn other_macs_of(&self, node: &str, now_unix: i64) -> BTreeMap<[u8; 6], String> {
        (self
            .nodes
            .get(node)
            .filter(|e| !e.expired(now_unix))
            .into_iter())
        .flat_map(|e| &e.record.other)
        .filter_map(|i| Some((parse_mac(&i.mac)?, i.name.clone())))
        .collect()
    }

    /// The MACs of `node`'s live record (None: no live record).
    pub fn macs_of(&self, node: &str, now_unix: i64) -> Option<BTreeSet<[u8; 6]>> {
        let e = self.nodes.get(node).filter(|e| !e.expired(now_unix))?;
        Some(
            (e.record.interfaces.iter())
                .filter_map(|i| parse_mac(&i.mac))
                .collect(),
        )
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
        t.insert(Entry {
            record: back,
            renew_unix: 100,
            duration_s: 30,
        });
        assert_eq!(t.other_macs_of("node-a", 110).len(), 1);
        assert_eq!(t.live(110), ["node-a"]);
        assert!(t.live(200).is_empty() && t.other_macs_of("node-a", 200).is_empty());
    }

    #[test]
    fn a_record_round_trips_and_bad_ones_are_named() {
        let r = record("node-a", &["02:00:00:00:00:0a"]);
        assert_eq!(Record::decode(Some(&r.encode())), Ok(r));
        assert_eq!(Record::decode(None), Err(Bad::Missing));
        let huge = "x".repeat(MAX_RECORD_BYTES + 1);
        assert_eq!(
            Record::decode(Some(&huge)),
            Err(Bad::TooLarge(MAX_RECORD_BYTES + 1))
        );
        assert!(matches!(
            Record::decode(Some("{\"node\":1}")),
            Err(Bad::Malformed(_))
        ));
        let bad_mac = record("n", &["02:00:00:00:00"]).encode();
        assert!(matches!(
            Record::decode(Some(&bad_mac)),
            Err(Bad::Malformed(e)) if e.contains("not a MAC")
        ));
    }

    #[test]
    fn a_record_with_too_many_interfaces_is_cut_to_its_bounds() {
        let macs: Vec<String> = (0..200)
            .map(|i| format!("02:00:00:00:00:{i:02x}"))
            .collect();
        let mut r = record("n", &macs.iter().map(String::as_str).collect::<Vec<_>>());
        r.interfaces[0].name = "x".repeat(100);
        let text = r.encode();
        assert!(text.len() <= MAX_RECORD_BYTES);
        let back = Record::decode(Some(&text)).unwrap();
        assert!(!back.interfaces.is_empty() && back.interfaces.len() <= MAX_INTERFACES);
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
    fn macs_of_live_records_name_their_node_and_expired_ones_do_not() {
        let mut t = Table::default();
        for (node, mac, renew) in [
            ("node-a", "02:00:00:00:00:0a", 100),
            ("node-b", "02:00:00:00:00:0b", 10),
        ] {
            t.insert(Entry {
                record: record(node, &[mac]),
                renew_unix: renew,
                duration_s: 30,
            });
        }
        let macs = t.macs(110);
        let a = parse_mac("02:00:00:00:00:0a").unwrap();
        let b = parse_mac("02:00:00:00:00:0b").unwrap();
        assert_eq!(
            describe(&whose(&macs, &a), &a),
            "node-a (eth0, 02:00:00:00:00:0a)"
        );
        assert_eq!(whose(&macs, &b), Whose::Outside, "node-b's record expired");
        assert!(describe(&Whose::Outside, &b).contains("not a guarded node"));
        assert_eq!(t.macs_of("node-a", 110), Some(BTreeSet::from([a])));
        assert_eq!(t.macs_of("node-b", 110), None);
    }

    #[test]
    fn the_table_is_bounded() {
        let mut t = Table::default();
        for i in 0..MAX_RECORDS + 5 {
            t.insert(Entry {
                record: record(&format!("n{i}"), &[]),
                renew_unix: 0,
                duration_s: 0,
            });
        }
        assert_eq!((t.nodes.len(), t.skipped), (MAX_RECORDS, 5));
    }
}
