//! The active census started for the daemon (`telemetry::probing` runs it,
//! `model::probing` decides): what it reads of the state the main loop, the
//! census and presence publish.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
};

use guard_common::Ownership;

use super::Daemon;
use crate::{
    api::{state::ApiState, Shared},
    datapath::{
        sys::{ifindex, link_addrs_by_index},
        wire::Wire,
    },
    model::probing::OwnerMacs,
    senders::probing::{self, Plan, ProbeTask, ProbingFacts},
};

/// Why what this node believes of ownership may be wrong now, if it may: a
/// feed that has not listed everything or cannot see now may call an IP
/// foreign that is not; a main loop that stopped publishing leaves old
/// states (the program stops trusting `foreign` then too). What the parts
/// that act on `foreign` (refreshes, probe verdicts) hold back for.
pub(super) fn blind(shared: &Shared, st: &ApiState, stale_after_ns: u64) -> Option<&'static str> {
    let heartbeat = shared
        .heartbeat_ns
        .load(std::sync::atomic::Ordering::Relaxed);
    let feed = st.status.as_ref().and_then(|s| s.feed.as_ref());
    if st.feed_failing_since.is_some() || feed.is_some_and(|f| f.blind) {
        Some("the ownership feed cannot see the API now")
    } else if feed.is_some_and(|f| !f.synced) || (st.feed_enabled && feed.is_none()) {
        Some("the ownership feed has not listed everything yet")
    } else if feed.is_some_and(|f| f.degraded) {
        Some("the ownership feed is degraded")
    } else if crate::datapath::monotonic_ns().saturating_sub(heartbeat) > stale_after_ns {
        Some("the main loop's heartbeat is stale")
    } else {
        None
    }
}

impl Daemon {
    /// Start the active census when configured and possible; what is
    /// missing is said once and guarding goes on without it.
    pub(super) fn start_probing(&self) {
        let Some(pace) = self.cfg.probing else {
            return;
        };
        let missing = if self.cfg.presence.is_none() {
            Some("presence is off (it needs the Kubernetes API and --presence-period > 0): the share of each guard is computed over the live guards")
        } else if !self.dp.census_loaded() {
            Some("the census is off: answers are read from it")
        } else {
            None
        };
        if let Some(why) = missing {
            tracing::info!(why, "the active census (--probe-interval) does not run");
            return;
        }
        let wire = match Wire::open() {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "the active census cannot open its socket; it does not run");
                return;
            }
        };
        let (plan, facts, publish) = (
            self.shared.clone(),
            self.shared.clone(),
            self.shared.clone(),
        );
        let stale_after = self.cfg.datapath.gate.stale_after.as_nanos() as u64;
        let spawned = probing::spawn(ProbeTask {
            wire,
            node: self.node.clone(),
            pace,
            plan: Box::new(move || plan_of(&plan, stale_after)),
            facts: Box::new(move |ips| {
                let st = facts.read();
                ProbingFacts {
                    blind: blind(&facts, &st, stale_after),
                    ..facts_of(&st, ips)
                }
            }),
            publish: Box::new(move |doc| publish.write().probes = Some(doc)),
            events: self.shared.events.clone(),
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "the active census cannot start its thread; guarding without it");
        }
    }
}

/// The share's inputs, now.
fn plan_of(shared: &Arc<Shared>, stale_after_ns: u64) -> Plan {
    let links = link_addrs_by_index();
    let st = shared.read();
    Plan {
        live: st
            .presence
            .as_ref()
            .filter(|p| p.read_unix.is_some())
            .map(|p| p.table.live()),
        foreign: (st.ips.iter())
            .filter(|(_, e)| e.state == Ownership::Foreign)
            .map(|(ip, e)| (*ip, e.owner.clone()))
            .collect(),
        owned_anywhere: (st.ips.values())
            .filter(|e| e.state != Ownership::Unknown)
            .count(),
        blind: blind(shared, &st, stale_after_ns),
        uplinks: (st.uplinks.keys())
            .filter_map(|name| {
                let i = ifindex(name).ok()?;
                Some((i, *links.macs.get(&i)?, links.link_locals.get(&i).copied()))
            })
            .collect(),
    }
}

/// What the answers about `ips` are judged against, now.
fn facts_of(st: &ApiState, ips: &BTreeSet<IpAddr>) -> ProbingFacts {
    let table = st.presence.as_ref().map(|p| p.table.clone());
    ProbingFacts {
        claims: st.census.as_ref().map(|c| c.claims.clone()),
        known: table.as_ref().map(|t| t.macs()).unwrap_or_default(),
        owner_now: (ips.iter())
            .map(|ip| (*ip, st.ips.get(ip).and_then(|e| e.owner.clone())))
            .collect(),
        blind: None,
        owners: (ips.iter())
            .filter_map(|ip| {
                let owner = st.ips.get(ip)?.owner.as_deref()?;
                let t = table.as_ref()?;
                Some((
                    *ip,
                    OwnerMacs {
                        uplinks: t.macs_of(owner),
                        other: t.other_macs_of(owner),
                    },
                ))
            })
            .collect::<BTreeMap<_, _>>(),
    }
}
