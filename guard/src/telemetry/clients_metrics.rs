//! The metrics of misdirected and stale clients: per LB IP (a bounded set
//! of series chosen first come, the rest folded into `lb_ip="other"`, never
//! a client as a label), the node's stale clients, and the histogram of
//! client-visible failover times.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use super::family::Family;
use crate::model::clients::{Cause, Clients};

/// The counter and gauge families of the clients.
#[derive(Debug, Default)]
pub(super) struct Families {
    pub(super) counters: Vec<Family<u64>>,
    pub(super) gauges: Vec<Family<f64>>,
}

/// What the families are made of: the clients document's parts.
pub(super) struct Parts<'a> {
    pub(super) series: &'a IpSeries,
    pub(super) ips: &'a Clients,
    pub(super) totals: &'a BTreeMap<String, u64>,
    pub(super) entries: usize,
    pub(super) refreshes: Option<&'a BTreeMap<String, u64>>,
}

impl<'a> Parts<'a> {
    /// The parts of `doc` (the clients task's document: the wire type with
    /// its series beside it).
    pub(super) fn of(doc: &'a guard_wire::clients::ClientsDoc<IpSeries>) -> Self {
        Parts {
            series: &doc.series,
            ips: &doc.ips,
            totals: &doc.totals,
            entries: doc.entries,
            refreshes: doc.refreshes.as_ref(),
        }
    }
}

/// Which LB IPs have their own series: first come, first labelled, and
/// kept while the IP is in the LB set (no series flaps); past the limit an
/// IP's packets are added to `lb_ip="other"` (per family), which only grows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IpSeries {
    labelled: BTreeSet<IpAddr>,
    /// Folded IPs and their total when last added to `other`.
    folded: BTreeMap<IpAddr, u64>,
    other_packets: BTreeMap<&'static str, u64>,
    /// This read's values: (IP, packets, clients sending), labelled IPs.
    rows: Vec<(IpAddr, u64, usize)>,
    other_sending: BTreeMap<&'static str, u64>,
}

impl IpSeries {
    /// The series for `clients` (every LB IP with misdirected packets).
    pub fn update(&mut self, clients: &Clients, max: usize) {
        self.labelled.retain(|ip| clients.contains_key(ip));
        self.folded.retain(|ip, _| clients.contains_key(ip));
        self.rows.clear();
        self.other_sending.clear();
        for (ip, c) in clients {
            if !self.labelled.contains(ip) && !self.folded.contains_key(ip) {
                if self.labelled.len() < max {
                    self.labelled.insert(*ip);
                } else {
                    self.folded.insert(*ip, 0);
                }
            }
            let family = guard_common::family(ip);
            if self.labelled.contains(ip) {
                self.rows.push((*ip, c.packets_total, c.sending));
            } else if let Some(last) = self.folded.get_mut(ip) {
                *self.other_packets.entry(family).or_default() +=
                    c.packets_total.saturating_sub(*last);
                *last = c.packets_total.max(*last);
                *self.other_sending.entry(family).or_default() += c.sending as u64;
            }
        }
    }
}

/// The families of a clients document (the histogram goes through
/// [`FailoverCollector`]).
pub(super) fn families(doc: Parts<'_>) -> Families {
    let mut v = Families::default();
    let s = doc.series;
    let labels = |ip: String, family: &str| vec![("lb_ip", ip), ("family", family.to_owned())];
    let others = |m: &BTreeMap<&'static str, _>| -> Vec<_> {
        m.iter()
            .map(|(f, n)| (labels("other".into(), f), *n))
            .collect()
    };
    let mut packets: Vec<_> = (s.rows.iter())
        .map(|(ip, p, _)| (labels(ip.to_string(), guard_common::family(ip)), *p))
        .collect();
    packets.extend(others(&s.other_packets));
    v.counters.push((
        "arp_guard_misdirected_packets",
        "Packets that arrived here for an LB IP that is foreign here (a client's neighbour cache points here), per LB IP (at most --metrics-max-ip-series, the rest in lb_ip=\"other\").",
        packets,
    ));
    let mut sending: Vec<_> = (s.rows.iter())
        .map(|(ip, _, n)| (labels(ip.to_string(), guard_common::family(ip)), *n as f64))
        .collect();
    sending.extend(
        others(&s.other_sending)
            .into_iter()
            .map(|(l, n)| (l, n as f64)),
    );
    v.gauges.push((
        "arp_guard_misdirected_clients",
        "Clients (MACs) still sending here for an LB IP that is foreign here.",
        sending,
    ));
    v.gauges.push((
        "arp_guard_stale_clients",
        "Clients still sending here --stale-client-after past the move (after_move) or their first packet (not_owned_here).",
        Cause::ALL
            .iter()
            .map(|c| {
                let n: usize = (doc.ips.values())
                    .filter(|e| e.cause == Some(*c))
                    .map(|e| e.stale)
                    .sum();
                (vec![("cause", c.as_str().to_owned())], n as f64)
            })
            .collect(),
    ));
    v.gauges.push((
        "arp_guard_stale_client_oldest_seconds",
        "How long the longest-stale client has been misdirected here (0: none stale).",
        vec![(
            vec![],
            (doc.ips.values())
                .filter_map(|e| e.oldest_stale_s)
                .fold(0.0, f64::max),
        )],
    ));
    v.counters.push((
        "arp_guard_misdirected_frames",
        "Packets for foreign LB IPs seen by the census: recorded, new_client, insert_failed (table refused), other_host (addressed to another MAC: flooded).",
        (doc.totals.iter())
            .map(|(k, n)| (vec![("outcome", k.clone())], *n))
            .collect(),
    ));
    if let Some(r) = doc.refreshes {
        v.counters.push((
            "arp_guard_client_refreshes",
            "--refresh-stale-clients: unicast refreshes teaching a misdirected client the owner's MAC, by outcome (sent, send_failed, or why not: not_foreign, blind, owner_uncertain, own_mac, rate_limited, over_limit).",
            (r.iter())
                .map(|(k, n)| (vec![("outcome", k.clone())], *n))
                .collect(),
        ));
    }
    v.gauges.push((
        "arp_guard_client_table_entries",
        "Entries in the census's client table (LRU; capacity in /clients).",
        vec![(vec![], doc.entries as f64)],
    ));
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::clients::IpClients;

    fn ip(i: u8) -> IpAddr {
        IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, i))
    }

    fn clients(of: &[(u8, u64)]) -> Clients {
        of.iter()
            .map(|(i, packets)| {
                let c = IpClients {
                    state: guard_common::Ownership::Foreign,
                    cause: Some(Cause::AfterMove),
                    moved_ago_s: None,
                    packets_total: *packets,
                    sending: 1,
                    stale: 0,
                    oldest_stale_s: None,
                    clients: vec![],
                    more: 0,
                };
                (ip(*i), c)
            })
            .collect()
    }

    /// Labels go first come and stay; the folded rest only grows, also
    /// when a folded IP leaves; a label freed goes to the next newcomer.
    #[test]
    fn series_are_bounded_stable_and_monotonic() {
        let mut s = IpSeries::default();
        s.update(&clients(&[(1, 5), (2, 5), (3, 5)]), 2);
        assert_eq!(s.rows.len(), 2);
        assert_eq!(s.other_packets["ipv4"], 5);
        s.update(&clients(&[(1, 6), (2, 6), (3, 50)]), 2);
        assert_eq!(s.other_packets["ipv4"], 50);
        s.update(&clients(&[(1, 7), (2, 7)]), 2);
        assert_eq!(s.other_packets["ipv4"], 50, "never goes down");
        s.update(&clients(&[(1, 8), (4, 1)]), 2);
        assert!(s.rows.iter().any(|(i, ..)| *i == ip(4)));
        let mut none = IpSeries::default();
        none.update(&clients(&[(1, 2)]), 0);
        assert!(none.rows.is_empty());
        assert_eq!(none.other_sending["ipv4"], 1);
    }
}
