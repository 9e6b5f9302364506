//! An LB IP shared by Services whose announcer elected different nodes (a
//! split election: Cilium and kube-vip hold one Lease per Service, MetalLB
//! one status per Service), told on every Service of the IP.
//!
//! - **Seen alike everywhere.** Every guard reads the same Services and
//!   records, so every guard sees the same split; one Event per Service
//!   must not become one per node.
//! - **Told by one node.** The poster is the holder that ranks first for
//!   the IP ([`score`], the active census's ranking) among the holders
//!   whose guards are live by presence (all of them, without presence):
//!   every guard computes the same without talking. Where views differ for
//!   a moment two may post; the Events are the same.
//! - **Repeated at most hourly** while it lasts, and a Normal
//!   Event on each Service when it ends.

use std::net::IpAddr;

use guard_wire::api::SplitElection;

use super::{Occurrence, Reason};

/// Services named in the Event (the rest are counted).
const NAMED: usize = 4;
use crate::model::probing::score;

/// The node that posts the split of `ip`: the first holder by rank among
/// those `live` (None: presence is off, every holder counts).
pub fn poster<'a>(
    ip: IpAddr,
    split: &'a SplitElection,
    live: Option<&[String]>,
) -> Option<&'a str> {
    let holders = split.holders();
    let live_holders: Vec<&str> = (holders.iter().copied())
        .filter(|h| live.is_none_or(|l| l.iter().any(|n| n == h)))
        .collect();
    // No holder's guard is live: the holders still decide among
    // themselves (the Event may then wait for one of them).
    let pool = if live_holders.is_empty() {
        holders
    } else {
        live_holders
    };
    pool.into_iter().max_by_key(|h| (score(h, ip), *h))
}

/// The Warning on each Service of a split `ip`.
pub fn split_election(ip: IpAddr, split: &SplitElection) -> Vec<(String, Occurrence)> {
    let announcer = announcer_of(split);
    // Named once for every Service's Event, at most NAMED of them (an IP
    // shared by hundreds of Services must not cost a note per Service that
    // lists them all; the API keeps 1 kB of it anyway).
    let mut named: Vec<String> = (split.services.iter().take(NAMED))
        .map(|s| match &s.holder {
            Some(h) => format!("{} ({}; announced by {h})", s.service, s.record),
            None => format!("{} ({})", s.service, s.record),
        })
        .collect();
    if split.services.len() > NAMED {
        named.push(format!(
            "and {} more Services",
            split.services.len() - NAMED
        ));
    }
    let holders = split.holders().join(" and ");
    let outcome = match &split.settled_on {
        Some(n) => format!(
            "arp-guard keeps {n} as the owner and stops the others ({})",
            split.settle
        ),
        None => format!(
            "arp-guard stops no one: the IP is unknown to it ({})",
            split.settle
        ),
    };
    (split.services.iter())
        .map(|s| {
            let note = format!(
                "{ip} is shared by Services elected separately, and their records name different nodes: {}. {holders} all announce {ip}, so clients follow whichever answered last. {outcome}. Cause: {}. Fix: one election per IP: {}",
                named.join(", "),
                cause(announcer),
                fix(announcer),
            );
            (
                s.service.clone(),
                Occurrence {
                    reason: Reason::SplitElection,
                    note,
                    node_at_fault: None,
                },
            )
        })
        .collect()
}

/// The Normal Event on each of `services` when the split of `ip` ends.
pub fn split_resolved(ip: IpAddr, services: &[String]) -> Vec<(String, Occurrence)> {
    (services.iter())
        .map(|s| {
            (
                s.clone(),
                Occurrence {
                    reason: Reason::SplitElectionResolved,
                    note: format!("the Services sharing {ip} no longer name different nodes: one node announces it again"),
                    node_at_fault: None,
                },
            )
        })
        .collect()
}

/// Which announcer's records these are (the feed's words name them).
fn announcer_of(split: &SplitElection) -> &'static str {
    let records = || split.services.iter().map(|s| s.record.as_str());
    if records().any(|r| r.starts_with("ServiceL2Status")) {
        "metallb"
    } else if records().any(|r| r.contains("cilium-l2announce-")) {
        "cilium"
    } else if records().any(|r| r.starts_with("Lease ")) {
        "kube-vip"
    } else {
        ""
    }
}

/// The announcer's setting that elects per Service, in words.
fn cause(announcer: &str) -> &'static str {
    match announcer {
        "cilium" => "Cilium L2 announcements hold one Lease per Service (cilium-l2announce-<namespace>-<name>), also for Services that share an IP through lbipam.cilium.io/sharing-key",
        "kube-vip" => "kube-vip with svc_election holds one Lease per Service (kubevip-<name>), also for Services that share a loadBalancerIP",
        "metallb" => "MetalLB's ServiceL2Status objects of the Services sharing the IP (metallb.io/allow-shared-ip) name different nodes",
        _ => "the announcer elects each Service on its own",
    }
}

fn fix(announcer: &str) -> &'static str {
    match announcer {
        "cilium" => "give the Services that share an IP one Service (several ports in one), or stop sharing the IP; with every one of them externalTrafficPolicy: Cluster, arp-guard --settle-shared-ips keeps one node",
        "kube-vip" => "use kube-vip's leader election for all Services (vip_leaderelection, one global Lease) or kube-vip.io/leaseName so that Services of one IP share one Lease; with every one of them externalTrafficPolicy: Cluster, arp-guard --settle-shared-ips keeps one node",
        "metallb" => "check the speakers' memberlist and that the Services' externalTrafficPolicy and endpoints agree (MetalLB elects per IP; Services whose Local endpoints sit on different nodes cannot share one)",
        _ => "one election per IP",
    }
}
