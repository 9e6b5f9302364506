//! The daemon's state in one document: served by the API (`/status`),
//! written to `--status-file`, read by `/metrics`, and shown by the CLI and
//! `kubectl arp-guard` (which read it back with these same types: they are
//! `guard_wire::status`'s). Here: how the daemon fills its parts.

use guard_common::Ownership;
/// The document and its parts (wire types).
pub use guard_wire::status::{
    ChosenBy, Counts, DaemonStatus, FamilyCounts, FeedHealth, Interface, InterfaceState,
};

use crate::model::{cluster::ClusterView, view::View};

/// Whether `node` is none of the Lease holders and announcing nodes the
/// synced feed names (and it names some), and, where presence tells the
/// names the guards run under (`guards`), some holder is none of them: a
/// `--node-name` (`NODE_NAME`) other than the name the announcer uses.
/// Without presence a node that holds no LB IP now looks the same. With
/// this node's own announcer's frames of IPs held by others
/// (`arp_guard_announce_total{outcome="expired"}`) it is the
/// misconfiguration that makes the guard stop its own owner
/// (ArpGuardDroppingOwnedIP); with presence, a split-brain speaker on a node
/// that holds nothing is not taken for it (every holder has its guard).
pub fn node_unmatched(
    c: &ClusterView,
    node: &str,
    guards: Option<&crate::model::presence::Table>,
) -> bool {
    let unguarded_holder = || match guards {
        Some(t) if !t.nodes.is_empty() => c.holders.iter().any(|h| !t.nodes.contains_key(h)),
        _ => true,
    };
    c.synced && !c.holders.is_empty() && !c.holders.contains(node) && unguarded_holder()
}

/// The LB IPs of `view`, by state.
pub fn counts(view: &View) -> Counts {
    Counts {
        total: view.lb.len(),
        owned: view.count(Ownership::Owned),
        foreign: view.count(Ownership::Foreign),
        unknown: view.count(Ownership::Unknown),
        ipv6: family_counts(
            view.lb
                .iter()
                .filter(|(ip, _)| ip.is_ipv6())
                .map(|(_, l)| l.state),
        ),
        split: splits(view, false),
        split_settled: splits(view, true),
    }
}

/// LB IPs of split elections (`settled`: only those settled on a node).
fn splits(view: &View, settled: bool) -> usize {
    (view.lb.values())
        .filter(|l| match &l.source {
            crate::model::view::Provenance::Cluster { split: Some(s), .. } => {
                !settled || s.settled_on.is_some()
            }
            _ => false,
        })
        .count()
}

fn family_counts(states: impl Iterator<Item = Ownership>) -> FamilyCounts {
    let mut c = FamilyCounts::default();
    for s in states {
        c.total += 1;
        match s {
            Ownership::Owned => c.owned += 1,
            Ownership::Foreign => c.foreign += 1,
            Ownership::Unknown => c.unknown += 1,
        }
    }
    c
}

/// The feed's health as node `node` sees it.
pub fn feed_health(
    announcers: &[&str],
    c: &ClusterView,
    node: &str,
    guards: Option<&crate::model::presence::Table>,
) -> FeedHealth {
    FeedHealth {
        announcers: announcers.iter().map(|a| (*a).to_owned()).collect(),
        synced: c.synced,
        degraded: c.degraded,
        blind: c.failing_since.is_some(),
        unconfirmed_leases: c.unconfirmed,
        threshold_seconds: c.threshold.as_secs(),
        streams: c.streams.clone(),
        problem: c.problem.clone(),
        node_unmatched: node_unmatched(c, node, guards),
    }
}
