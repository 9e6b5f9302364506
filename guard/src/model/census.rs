//! Who answers for each LB IP, from the census table (pure): the claims the
//! ingress program recorded become responders per IP, and conflicts.
//!
//! A conflict is either
//! - `contested`: two MACs claimed the IP within the window, and their runs
//!   of claims overlap (one kept claiming after the other began): a split
//!   brain, a stale speaker, every node's kernel answering. A clean move (the
//!   old claimant silent before the new one began: a failover) is not one;
//!   three or more claimants within one window are (flapping, or a flood:
//!   more than one failover can explain);
//! - `claimed_elsewhere`: this node owns the IP and another MAC claimed it
//!   since this node became its owner (a rogue host, a speaker that did not
//!   step down).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::Duration,
};

use guard_common::Kind;
/// The census as it is served (a wire type: the plugin reads it too).
pub use guard_wire::census::{Census, IpCensus, Reason, Responder};

use super::{
    fmt_mac,
    presence::{describe, whose, Whose},
};

/// At most this many responders per IP are listed (the rest are counted):
/// a flood of forged MACs cannot make the status or the API answer huge.
pub const MAX_LISTED: usize = 16;

/// One entry of the census map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CensusEntry {
    pub ip: IpAddr,
    pub mac: [u8; 6],
    /// Start of the current run of claims, and the latest (CLOCK_MONOTONIC ns).
    pub first_ns: u64,
    pub last_ns: u64,
    pub count: u64,
    pub ifindex: u32,
    /// One bit per [`Kind`].
    pub kinds: u8,
}

/// The census's claims with the claims kept from before a restart (its
/// table starts empty then), per LB IP: for a MAC both hold, one entry from
/// the earlier start of its run to its latest claim.
pub fn with_kept(
    claims: &std::sync::Arc<Vec<CensusEntry>>,
    kept: &BTreeMap<IpAddr, Vec<CensusEntry>>,
) -> std::sync::Arc<Vec<CensusEntry>> {
    if kept.is_empty() {
        return claims.clone();
    }
    let mut out: Vec<CensusEntry> = claims.to_vec();
    let at: std::collections::HashMap<(IpAddr, [u8; 6]), usize> = (out.iter().enumerate())
        .map(|(i, c)| ((c.ip, c.mac), i))
        .collect();
    for k in kept.values().flatten() {
        match at.get(&(k.ip, k.mac)) {
            Some(&i) => {
                let c = &mut out[i];
                c.first_ns = c.first_ns.min(k.first_ns);
                c.last_ns = c.last_ns.max(k.last_ns);
            }
            None => out.push(*k),
        }
    }
    std::sync::Arc::new(out)
}

/// What the census is judged against.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// Now, on the claims' clock.
    pub now_ns: u64,
    /// Claims older than this are history, not responders.
    pub window: Duration,
    /// LB IPs this node owns, with when it became the owner (same clock).
    pub owned_since: BTreeMap<IpAddr, u64>,
    /// This node's own MACs (a claim from one is this node's).
    pub local_macs: BTreeSet<[u8; 6]>,
    /// Interface names by index (a claim names the one it arrived on).
    pub ifnames: BTreeMap<u32, String>,
    /// Who each MAC is, from every guard's presence record.
    pub who: Who,
}

/// What presence and the ownership source tell about the claimants.
#[derive(Debug, Clone, Default)]
pub struct Who {
    /// Presence runs: a MAC no live record lists is named as outside.
    pub on: bool,
    /// MAC -> (node, interface) of every live guard.
    pub macs: BTreeMap<[u8; 6], (String, String)>,
    /// The owner node of each claimed LB IP, where the source names one.
    pub owners: BTreeMap<IpAddr, String>,
}

/// The census from the claims (any order), judged in `cx`.
pub fn assess(claims: &[CensusEntry], cx: &Context) -> Census {
    let mut by_ip: BTreeMap<IpAddr, Vec<&CensusEntry>> = BTreeMap::new();
    for c in claims {
        by_ip.entry(c.ip).or_default().push(c);
    }
    by_ip
        .into_iter()
        .map(|(ip, mut cs)| {
            cs.sort_by(|a, b| b.last_ns.cmp(&a.last_ns).then(a.mac.cmp(&b.mac)));
            (ip, one_ip(ip, &cs, cx))
        })
        .collect()
}

/// `cs` sorted most recent first.
fn one_ip(ip: IpAddr, cs: &[&CensusEntry], cx: &Context) -> IpCensus {
    let window = u64::try_from(cx.window.as_nanos()).unwrap_or(u64::MAX);
    let is_active = |c: &CensusEntry| cx.now_ns.saturating_sub(c.last_ns) <= window;
    let active: Vec<&CensusEntry> = cs.iter().copied().filter(|c| is_active(c)).collect();
    let conflict = if contested(&active) {
        Some(Reason::Contested)
    } else if cx.owned_since.get(&ip).is_some_and(|since| {
        active
            .iter()
            .any(|c| !cx.local_macs.contains(&c.mac) && c.last_ns >= *since)
    }) {
        Some(Reason::ClaimedElsewhere)
    } else {
        None
    };
    let ago = |t: u64| Duration::from_nanos(cx.now_ns.saturating_sub(t)).as_secs();
    let responders = cs
        .iter()
        .take(MAX_LISTED)
        .map(|c| {
            let local = cx.local_macs.contains(&c.mac);
            let w = (cx.who.on && !local).then(|| whose(&cx.who.macs, &c.mac));
            let (node, node_interface) = match &w {
                Some(Whose::Node { node, interface }) => {
                    (Some(node.clone()), Some(interface.clone()))
                }
                _ => (None, None),
            };
            Responder {
                mac: fmt_mac(&c.mac),
                claims: c.count,
                first_seen_ago_s: ago(c.first_ns),
                last_seen_ago_s: ago(c.last_ns),
                active: is_active(c),
                local,
                kinds: Kind::ALL
                    .iter()
                    .filter(|k| c.kinds & (1 << (**k as u8)) != 0)
                    .map(|k| k.as_str().to_owned())
                    .collect(),
                interface: cx
                    .ifnames
                    .get(&c.ifindex)
                    .cloned()
                    .unwrap_or_else(|| format!("ifindex:{}", c.ifindex)),
                node,
                node_interface,
                outside: w == Some(Whose::Outside),
            }
        })
        .collect();
    IpCensus {
        active: active.len(),
        owner: cx.who.owners.get(&ip).cloned(),
        conflict,
        responders,
        more: cs.len().saturating_sub(MAX_LISTED),
    }
}

/// Do the runs of claims of two active MACs overlap? The latest claimant's
/// run began at `first_ns`; any other that claimed after that kept claiming
/// while it did. One that fell silent before is a move, not a conflict; a
/// third claimant within the window is more than one move explains.
fn contested(active: &[&CensusEntry]) -> bool {
    let Some((latest, others)) = active.split_first() else {
        return false;
    };
    others.len() >= 2 || others.iter().any(|c| c.last_ns >= latest.first_ns)
}

/// The claims of `ip` in words, one per active responder that is neither
/// this node nor the owner: "node-b (eth0, 02:..) claims 198.51.100.100
/// owned by node-a", or the MAC named as belonging to no guarded node.
/// Empty while presence is off (the MACs alone say it then).
pub fn claims_in_words(ip: IpAddr, c: &IpCensus) -> Vec<String> {
    let owner = match &c.owner {
        Some(o) => format!("owned by {o}"),
        None => "with no owner known".into(),
    };
    (c.responders.iter())
        .filter(|r| r.active && !r.local && (r.node.is_some() || r.outside))
        .filter(|r| r.node.is_none() || r.node != c.owner)
        .filter_map(|r| {
            let mac = super::presence::parse_mac(&r.mac)?;
            let w = match (&r.node, &r.node_interface) {
                (Some(node), Some(interface)) => Whose::Node {
                    node: node.clone(),
                    interface: interface.clone(),
                },
                _ => Whose::Outside,
            };
            Some(format!("{} claims {ip} {owner}", describe(&w, &mac)))
        })
        .collect()
}

/// The IPs in conflict, for logs and metrics.
pub fn conflicts(c: &Census) -> BTreeMap<IpAddr, Reason> {
    c.iter()
        .filter_map(|(ip, e)| e.conflict.map(|r| (*ip, r)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Claims kept from before a restart stand beside the new census's: a
    /// MAC in both is one run from the earlier start.
    #[test]
    fn kept_claims_join_the_census() {
        let ip: IpAddr = "198.51.100.102".parse().unwrap();
        let c = |mac: u8, first: u64, last: u64| CensusEntry {
            ip,
            mac: [2, 0, 0, 0, 0, mac],
            first_ns: first,
            last_ns: last,
            count: 1,
            ifindex: 2,
            kinds: 1,
        };
        let census = std::sync::Arc::new(vec![c(0xa, 50, 60)]);
        assert!(std::sync::Arc::ptr_eq(
            &with_kept(&census, &BTreeMap::new()),
            &census
        ));
        let kept = BTreeMap::from([(ip, vec![c(0xa, 10, 20), c(0xb, 12, 12)])]);
        let all = with_kept(&census, &kept);
        assert_eq!(*all, vec![c(0xa, 10, 60), c(0xb, 12, 12)]);
    }

    const S: u64 = 1_000_000_000;
    const IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(203, 0, 113, 10));
    const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];

    fn claim(mac: [u8; 6], first: u64, last: u64) -> CensusEntry {
        CensusEntry {
            ip: IP,
            mac,
            first_ns: first * S,
            last_ns: last * S,
            count: 3,
            ifindex: 2,
            kinds: 1 << (Kind::Gratuitous as u8),
        }
    }

    fn cx(now: u64) -> Context {
        Context {
            now_ns: now * S,
            window: Duration::from_secs(60),
            ..Context::default()
        }
    }

    #[test]
    fn one_responder_is_no_conflict() {
        let c = assess(&[claim(A, 100, 150)], &cx(160));
        let e = &c[&IP];
        assert_eq!((e.active, e.conflict), (1, None));
        assert_eq!(e.responders[0].mac, "02:00:00:00:00:0a");
        assert_eq!(e.responders[0].kinds, vec!["gratuitous"]);
        assert_eq!(
            (
                e.responders[0].first_seen_ago_s,
                e.responders[0].last_seen_ago_s
            ),
            (60, 10)
        );
    }

    #[test]
    fn two_claimants_at_once_contest_the_ip() {
        // B began at 120, A still claimed at 130.
        let c = assess(&[claim(A, 100, 130), claim(B, 120, 150)], &cx(160));
        assert_eq!(c[&IP].conflict, Some(Reason::Contested));
        assert_eq!(c[&IP].active, 2);
        // Order does not matter; the most recent claimant is listed first.
        let c = assess(&[claim(B, 120, 150), claim(A, 100, 130)], &cx(160));
        assert_eq!(c[&IP].responders[0].mac, fmt_mac(&B));
        assert_eq!(conflicts(&c).len(), 1);
    }

    #[test]
    fn a_clean_failover_is_a_move_not_a_conflict() {
        // A claimed until 110, B took over at 115.
        let c = assess(&[claim(A, 100, 110), claim(B, 115, 150)], &cx(160));
        assert_eq!(c[&IP].conflict, None);
        assert_eq!(c[&IP].active, 2);
        // A claims again after B began: a stale speaker.
        let c = assess(&[claim(A, 100, 140), claim(B, 115, 150)], &cx(160));
        assert_eq!(c[&IP].conflict, Some(Reason::Contested));
        // Three claimants one after the other within the window: flapping.
        let cc: [u8; 6] = [2, 0, 0, 0, 0, 0xc];
        let c = assess(
            &[claim(A, 100, 110), claim(B, 115, 120), claim(cc, 125, 150)],
            &cx(160),
        );
        assert_eq!(c[&IP].conflict, Some(Reason::Contested));
    }

    #[test]
    fn claims_older_than_the_window_are_history() {
        let c = assess(&[claim(A, 10, 50), claim(B, 40, 150)], &cx(160));
        assert_eq!((c[&IP].active, c[&IP].conflict), (1, None));
        assert!(!c[&IP].responders[1].active);
    }

    #[test]
    fn the_owner_flags_another_mac_claiming_its_ip() {
        let mut k = cx(160);
        k.owned_since.insert(IP, 120 * S);
        k.local_macs.insert(A);
        // Another MAC claimed it before this node became the owner: a move.
        assert_eq!(assess(&[claim(B, 100, 110)], &k)[&IP].conflict, None);
        // ...and after: claimed elsewhere.
        assert_eq!(
            assess(&[claim(B, 100, 130)], &k)[&IP].conflict,
            Some(Reason::ClaimedElsewhere)
        );
        // This node's own MAC is no conflict.
        let c = assess(&[claim(A, 125, 150)], &k);
        assert_eq!(c[&IP].conflict, None);
        assert!(c[&IP].responders[0].local);
    }

    #[test]
    fn claimants_are_named_by_node_or_as_outside() {
        let mut k = cx(160);
        k.who.on = true;
        k.who.macs.insert(B, ("node-b".into(), "eth0".into()));
        k.who.macs.insert(A, ("node-a".into(), "eth0".into()));
        k.who.owners.insert(IP, "node-a".into());
        let rogue: [u8; 6] = [2, 0, 0, 0, 0, 0x66];
        let c = assess(
            &[
                claim(A, 100, 150),
                claim(B, 120, 150),
                claim(rogue, 125, 150),
            ],
            &k,
        );
        let e = &c[&IP];
        assert_eq!(e.owner.as_deref(), Some("node-a"));
        let words = claims_in_words(IP, e);
        assert_eq!(
            words,
            [
                "node-b (eth0, 02:00:00:00:00:0b) claims 203.0.113.10 owned by node-a",
                "02:00:00:00:00:66 (not a guarded node: a device outside the cluster or a node without the guard) claims 203.0.113.10 owned by node-a",
            ]
        );
        // Without presence, nothing is said of who a MAC is.
        k.who.on = false;
        let c = assess(&[claim(B, 120, 150)], &k);
        assert!(claims_in_words(IP, &c[&IP]).is_empty());
        assert!(!c[&IP].responders[0].outside && c[&IP].responders[0].node.is_none());
    }

    #[test]
    fn a_flood_of_macs_is_listed_bounded() {
        let claims: Vec<CensusEntry> = (0..1000u32)
            .map(|i| {
                let b = i.to_be_bytes();
                claim([2, 0, b[0], b[1], b[2], b[3]], 100, 150)
            })
            .collect();
        let c = assess(&claims, &cx(160));
        assert_eq!(c[&IP].responders.len(), MAX_LISTED);
        assert_eq!(c[&IP].more, 1000 - MAX_LISTED);
        assert_eq!(c[&IP].active, 1000);
        assert_eq!(c[&IP].conflict, Some(Reason::Contested));
    }
}
