//! A guard's presence record: who it is (its node, the guarded interfaces
//! and their MACs, its mode, version and health), as the annotation of a
//! coordination.k8s.io Lease `arp-guard-<node>` in its own namespace. Every
//! guard writes its own and reads everyone's (`guard::model::presence`:
//! the table they keep); `kubectl arp-guard` reads them to name the node
//! behind a MAC. The record, its bounds and how it is read and written.

use serde::{Deserialize, Serialize};

/// The label every presence Lease carries (what the guards list by).
pub const LABEL: &str = "app.kubernetes.io/component";
pub const LABEL_VALUE: &str = "arp-guard-presence";
/// The annotation holding the record (JSON).
pub const ANNOTATION: &str = "arp-guard.io/presence";
/// Longest record accepted or written, in bytes of its JSON: a huge or
/// hostile Lease costs its reader at most this much once parsed.
pub const MAX_RECORD_BYTES: usize = 4096;
/// At most this many interfaces per record (longer lists are cut).
pub const MAX_INTERFACES: usize = 32;
/// Longest node name kept from a record (a Kubernetes name is at most 253).
pub const MAX_NAME: usize = 253;

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
}
