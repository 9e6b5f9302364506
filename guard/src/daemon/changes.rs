//! A source published: bring the view and the maps along. When the changed
//! LB IPs are known (the cluster feed says which claims changed, an address
//! came or went) only those are re-derived and written; anything else (the
//! ownership file, the feed syncing or degrading, the first change) derives
//! the whole view. The periodic full reconcile repairs whatever drifts.

use std::{collections::BTreeSet, net::IpAddr};

use super::{
    publish::{self, Changed},
    takeover::Transition,
    Daemon, Sources,
};
use crate::model::{
    addrs::AddrTable,
    cluster::OwnerTable,
    view::{compute, ClusterIn, Inputs, LbIp, View},
};

/// The addresses that came or went on the LB interfaces between two tables.
fn addr_changes(old: &AddrTable, new: &AddrTable, lb_ifaces: &[String]) -> BTreeSet<IpAddr> {
    // Sorted vectors, not sets: thousands of addresses cost microseconds.
    let sorted = |t: &AddrTable, n: &str| -> Vec<IpAddr> {
        let v4 = t.v4_of(n).iter().map(|a| IpAddr::V4(a.addr));
        let mut v: Vec<IpAddr> = v4
            .chain(t.v6_of(n).iter().map(|a| IpAddr::V6(*a)))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let mut out = BTreeSet::new();
    for name in lb_ifaces {
        if old.v4_of(name) == new.v4_of(name) && old.v6_of(name) == new.v6_of(name) {
            continue;
        }
        let (a, b) = (sorted(old, name), sorted(new, name));
        let (mut i, mut j) = (0, 0);
        while i < a.len() || j < b.len() {
            match (a.get(i), b.get(j)) {
                (Some(x), Some(y)) if x == y => {
                    i += 1;
                    j += 1;
                }
                (Some(x), Some(y)) if x < y => {
                    out.insert(*x);
                    i += 1;
                }
                (Some(x), None) => {
                    out.insert(*x);
                    i += 1;
                }
                (_, Some(y)) => {
                    out.insert(*y);
                    j += 1;
                }
                (None, None) => break,
            }
        }
    }
    out
}

impl Daemon {
    /// What changed in the feed's claims since the version this daemon last
    /// read (the feed's log; read whatever the path: a full derivation
    /// covers them too), and whether the log no longer reaches back that
    /// far (then everything is derived).
    fn claims_changed(&mut self, t: Option<&OwnerTable>) -> (BTreeSet<IpAddr>, bool) {
        let Some(t) = t else {
            return (BTreeSet::new(), false);
        };
        let since = t.changed_since(self.claims_seen);
        self.claims_seen = t.version;
        match since {
            Some(changed) => (changed, false),
            None => (BTreeSet::new(), true),
        }
    }

    /// Choose the uplinks again from the table and the cluster's hints;
    /// whether the choice changed.
    fn choose_uplinks(&mut self, sources: &mut Sources, table: &AddrTable) -> bool {
        let hints = (sources.hints.as_mut()).map(|h| h.borrow_and_update().clone());
        self.attachments.choose(table, &hints.unwrap_or_default())
    }

    /// A source published: bring the view and the maps to it, follow links
    /// that came or went, publish the state. `file_event`: the ownership
    /// file's change woke the loop (which marked it seen); one that came
    /// with another source's shows as not yet seen.
    pub(super) fn on_source_changed(&mut self, sources: &mut Sources, file_event: bool) {
        let file_changed =
            file_event || (sources.file.as_ref()).is_some_and(|f| f.has_changed().unwrap_or(false));
        let file = sources.file.as_mut().map(|f| f.borrow_and_update().clone());
        let table = sources.addrs.borrow_and_update().clone();
        let cluster = (sources.cluster.as_mut()).map(|c| c.borrow_and_update().clone());
        if let Some(c) = &cluster {
            self.warn_once_if_node_unknown(c);
        }
        let flags = cluster.as_ref().map(|c| (c.synced, c.degraded));
        let unsynced = flags.is_some_and(|(synced, _)| !synced);
        let settling = settling(flags, self.cluster_flags);
        let uplinks_changed = self.choose_uplinks(sources, &table);
        let full = self.full_next || file_changed || unsynced || uplinks_changed;
        let full = full || flags != self.cluster_flags;
        let uplinks = self.attachments.choice.names();
        let claims = cluster.as_ref().map(|c| c.owners.lock());
        let (taken, lost) = self.claims_changed(claims.as_deref());
        let full = full || lost;
        let inputs = Inputs {
            node: &self.node,
            file: file.as_ref(),
            lb_ifaces: &self.cfg.sources.lb_ifaces,
            uplinks: &uplinks,
            addrs: &table,
            cluster: (claims.as_ref().zip(cluster.as_ref())).map(|(t, c)| ClusterIn {
                owners: &t.owners,
                degraded: c.degraded,
            }),
        };
        let (changed, transitions) = if full {
            let mut next = compute(&inputs);
            if unsynced {
                next.hold_previous(|ip| self.dp.map_state(ip));
            }
            if next == self.view {
                (Changed::Nothing, Vec::new())
            } else {
                publish::log_changes(&self.view, &next);
                let t = transitions(&self.view, &next);
                self.view = next;
                (Changed::All, t)
            }
        } else {
            let mut ips: BTreeSet<IpAddr> = taken.iter().copied().collect();
            ips.extend(addr_changes(
                &self.addrs,
                &table,
                &self.cfg.sources.lb_ifaces,
            ));
            update(&mut self.view, &inputs, &ips)
        };
        drop(claims);
        self.full_next = false;
        self.cluster_flags = flags;
        self.apply_changed(&changed, unsynced);
        // After the maps say so: held announcements of IPs owned now go out.
        let at_ns = change_time(cluster.as_ref(), !taken.is_empty());
        self.on_transitions(&transitions, at_ns, settling);
        // How long a cluster event took to reach the maps (BENCHMARKS.md).
        if !matches!(changed, Changed::Nothing) {
            if let Some(at) = cluster.as_ref().and_then(|c| c.event_at) {
                tracing::debug!(
                    feed_to_map_us = at.elapsed().as_micros() as u64,
                    "cluster change applied"
                );
            }
        }
        // Uplinks that joined or left the choice, interfaces that appeared,
        // vanished or were renamed (after the maps know their addresses).
        if uplinks_changed || table.links != self.links {
            self.attachments.sync(&mut self.dp, &table);
            self.links = table.links.clone();
        }
        self.addrs = table;
        self.publish(cluster.as_ref(), &changed);
    }

    /// Write what changed into the maps. A failed write is retried (in
    /// full) with every heartbeat until one succeeds.
    fn apply_changed(&mut self, changed: &Changed, additive: bool) {
        let ok = match changed {
            Changed::Nothing => return,
            Changed::All => publish::apply(&mut self.dp, &self.view, additive, &self.shared.ops),
            Changed::Keys(keys) => {
                let ops = &self.shared.ops;
                publish::apply_changes(&mut self.dp, &self.view, keys, additive, ops)
            }
        };
        self.dirty = match changed {
            Changed::All => !ok,
            _ => self.dirty || !ok,
        };
    }
}

/// When a change happened (CLOCK_MONOTONIC ns), the start of a takeover's
/// clock: as the feed saw it (its event's arrival) when the cluster's
/// claims changed, else now.
fn change_time(cluster: Option<&crate::model::cluster::ClusterView>, from_cluster: bool) -> u64 {
    let now = crate::datapath::monotonic_ns();
    match cluster.and_then(|c| c.event_at) {
        Some(t) if from_cluster => {
            now.saturating_sub(u64::try_from(t.elapsed().as_nanos()).unwrap_or(0))
        }
        _ => now,
    }
}

/// Until, and at, the first view with the feed synced (`flags`: synced,
/// degraded; now and at the last change), changes bring in what the cluster
/// already had: an IP owned here since before this daemon started is not a
/// takeover (a restart must look like neither a takeover nor a silent one).
fn settling(flags: Option<(bool, bool)>, last: Option<(bool, bool)>) -> bool {
    let synced = |f: Option<(bool, bool)>| f.is_some_and(|(s, _)| s);
    flags.is_some() && !(synced(flags) && synced(last))
}

/// The LB IPs whose state differs between two views.
fn transitions(old: &View, new: &View) -> Vec<Transition> {
    let state = |v: &View, ip: &IpAddr| v.lb.get(ip).map(|l| l.state);
    let ips: BTreeSet<&IpAddr> = old.lb.keys().chain(new.lb.keys()).collect();
    ips.into_iter()
        .map(|ip| (*ip, state(old, ip), state(new, ip)))
        .filter(|(_, a, b)| a != b)
        .collect()
}

/// Re-derive the LB IPs `ips` of `view`, logging each change; what changed,
/// and the IPs whose state did.
fn update(
    view: &mut View,
    inputs: &Inputs<'_>,
    ips: &BTreeSet<IpAddr>,
) -> (Changed, Vec<Transition>) {
    let before: Vec<(IpAddr, Option<LbIp>)> = ips
        .iter()
        .map(|ip| (*ip, view.lb.get(ip).cloned()))
        .collect();
    let ifs = (
        view.if_addrs.clone(),
        view.if_primary.clone(),
        view.vlan_uppers.clone(),
    );
    let keys = view.update(inputs, ips);
    let same_ifs = ifs
        == (
            view.if_addrs.clone(),
            view.if_primary.clone(),
            view.vlan_uppers.clone(),
        );
    let mut moved = Vec::new();
    for (ip, old) in before.iter().filter(|(ip, _)| keys.contains(ip)) {
        let new = view.lb.get(ip);
        publish::log_change(*ip, old.as_ref(), new);
        let (a, b) = (old.as_ref().map(|l| l.state), new.map(|l| l.state));
        if a != b {
            moved.push((*ip, a, b));
        }
    }
    let changed = match (keys.is_empty(), same_ifs) {
        (true, true) => Changed::Nothing,
        (_, true) => Changed::Keys(keys),
        // The uplink's addresses changed (rare): the API's per-IP table
        // shows them, so everything is published anew.
        (_, false) => Changed::All,
    };
    (changed, moved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::addrs::IfAddrV4;
    use std::net::Ipv4Addr;

    #[test]
    fn address_changes_are_the_symmetric_difference_on_lb_interfaces() {
        let table = |lb: &[u8], up: &[u8]| {
            let mut t = AddrTable::default();
            t.links.insert("kube-ipvs0".into(), 5);
            t.links.insert("eth0".into(), 2);
            let a = |i: &u8| IfAddrV4 {
                addr: Ipv4Addr::new(10, 0, 0, *i),
                prefix: 32,
                secondary: false,
            };
            t.v4.insert(5, lb.iter().map(a).collect());
            t.v4.insert(2, up.iter().map(a).collect());
            t
        };
        let lb = ["kube-ipvs0".to_string()];
        let ip = |i| IpAddr::V4(Ipv4Addr::new(10, 0, 0, i));
        let old = table(&[3, 1, 2, 1], &[9]);
        assert!(addr_changes(&old, &old, &lb).is_empty());
        let new = table(&[4, 2, 1], &[8]);
        assert_eq!(
            addr_changes(&old, &new, &lb),
            BTreeSet::from([ip(3), ip(4)])
        );
        assert_eq!(
            addr_changes(&old, &AddrTable::default(), &lb),
            BTreeSet::from([ip(1), ip(2), ip(3)])
        );
        // IPv6 addresses on an LB interface count as well.
        let mut v6 = old.clone();
        let a: std::net::Ipv6Addr = "fd00::5".parse().unwrap();
        v6.v6.insert(5, vec![a]);
        assert_eq!(
            addr_changes(&old, &v6, &lb),
            BTreeSet::from([IpAddr::V6(a)])
        );
    }
}
