//! Healing stale clients (`--refresh-stale-clients`), on the client
//! reader's thread: each read, the clients whose packets for a `foreign`
//! LB IP arrived since the previous read are judged (pure:
//! `model::refresh`), and those the judgement allows get one unicast ARP
//! reply / Neighbor Advertisement teaching the owner's MAC, sent through
//! the daemon's own marked socket (the guard's program lets frames with
//! that mark out: they do not teach "LB IP -> this node").
//!
//! What stays safe when this is blind: no census read yet, the census sees
//! two claimants or a conflict (unless the owner's presence record names
//! one of them), the feed blind or degraded, the main loop stalled, the IP
//! not `foreign` here: nothing is sent (a client keeps what it has, as
//! without this option).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
    time::Duration,
};

use guard_common::Ownership;

use crate::{
    datapath::{sys::link_macs_by_index, wire::Wire},
    model::{
        census::CensusEntry,
        clients::{Entry, IpState},
        fmt_mac,
        refresh::{
            owner_from_census, owner_with_presence, refresh_frame, Claimant, Client, OwnerMac,
            Presence, RefreshFacts, Refresher, Skip,
        },
    },
};

/// At most this many refreshes per read, whatever the table holds: a flood
/// of forged source MACs sending to a foreign IP must not become a flood of
/// unicast frames to unknown MACs (which switches flood to every port).
pub const MAX_PER_READ: usize = 16;
/// At most this many lines about refreshes sent per read.
const LOG_PER_READ: usize = 8;

/// What the daemon knows beyond the clients, read when there is a client
/// to consider.
#[derive(Debug, Clone, Default)]
pub struct Knowledge {
    /// The ownership source cannot be trusted now: the Kubernetes feed not
    /// synced, failing or degraded.
    pub blind: bool,
    /// The census's latest claims (None: no census read yet).
    pub claims: Option<Arc<Vec<CensusEntry>>>,
    /// LB IPs with a census conflict.
    pub conflicts: BTreeSet<IpAddr>,
    /// When each IP asked took its current state and source (its owner),
    /// on the census's clock: claims count from then.
    pub changed_ns: BTreeMap<IpAddr, u64>,
    /// Presence (None: off): the MACs of each asked IP's owner node's live
    /// record (none: no such record), and every live guard's MACs.
    pub presence: Option<PresenceFacts>,
}

/// How the healer learns what the daemon knows about some LB IPs.
pub type KnowledgeOf = Box<dyn Fn(&BTreeSet<IpAddr>) -> Knowledge + Send + Sync>;

/// What presence says about the owners of the IPs asked.
#[derive(Debug, Clone, Default)]
pub struct PresenceFacts {
    pub owner_macs: BTreeMap<IpAddr, BTreeSet<[u8; 6]>>,
    pub uplink_macs: BTreeSet<[u8; 6]>,
}

/// The healer: its socket, its per-client limits, and how to learn what
/// the daemon knows.
pub struct Healer {
    pub wire: Wire,
    pub refresher: Refresher,
    /// `--announce-hold`: the new owner's first announcements can precede
    /// the move as the feed saw it by this much.
    pub hold: Duration,
    /// What the daemon knows about these LB IPs now.
    pub knowledge: KnowledgeOf,
    /// Refreshes by outcome (`sent`, `send_failed`, or why not).
    pub outcomes: BTreeMap<&'static str, u64>,
}

impl crate::telemetry::clients::Heal for Healer {
    fn outcomes(&self) -> &BTreeMap<&'static str, u64> {
        &self.outcomes
    }

    /// Consider the clients with packets since `since_ns`, against the
    /// states the reader judged them by; send what is allowed.
    fn heal(
        &mut self,
        entries: &[Entry],
        ips: &BTreeMap<IpAddr, IpState>,
        since_ns: u64,
        now_ns: u64,
    ) {
        self.refresher.prune(now_ns);
        let mut fresh: Vec<&Entry> = entries
            .iter()
            .filter(|e| e.last_ns > since_ns)
            // A group MAC is nobody's cache (and a switch floods it).
            .filter(|e| e.mac[0] & 1 == 0)
            .filter(|e| {
                ips.get(&e.ip)
                    .is_some_and(|s| s.state == Ownership::Foreign)
            })
            .collect();
        if fresh.is_empty() {
            return;
        }
        let asked: BTreeSet<IpAddr> = fresh.iter().map(|e| e.ip).collect();
        let k = (self.knowledge)(&asked);
        let local = link_macs_by_index();
        let read = Read {
            claimants: claimants_of(&k, asked),
            local_set: local.values().copied().collect(),
            local,
            k,
            ips,
            hold_ns: self.hold.as_nanos() as u64,
        };
        // The longest-sending clients first: a flood of new (forged) MACs
        // cannot starve a client that was stale before it began.
        fresh.sort_by_key(|e| e.first_ns);
        let mut sends = 0;
        for e in fresh {
            if sends == MAX_PER_READ {
                *self.outcomes.entry("over_limit").or_default() += 1;
                continue;
            }
            let client = Client {
                ip: e.ip,
                mac: e.mac,
                client_ip: e.client_ip,
                ifindex: e.ifindex,
                vlan: e.vlan,
            };
            let facts = read.facts(e);
            let outcome = match self.refresher.decide(&client, &facts, now_ns) {
                Err(skip) => {
                    if let Skip::OwnerUncertain(why) = skip {
                        tracing::debug!(target: "arp_guard::refresh", lb_ip = %e.ip, mac = %fmt_mac(&e.mac), why, "stale client not refreshed");
                    }
                    skip.as_str()
                }
                Ok(owner) => {
                    sends += 1;
                    self.send(&read, &client, owner, facts.owner, sends <= LOG_PER_READ)
                }
            };
            *self.outcomes.entry(outcome).or_default() += 1;
        }
    }
}

impl Healer {
    /// Send one refresh; its outcome.
    fn send(
        &self,
        read: &Read<'_>,
        c: &Client,
        owner: [u8; 6],
        known: OwnerMac,
        log: bool,
    ) -> &'static str {
        let sent = read
            .local
            .get(&c.ifindex)
            .and_then(|ours| refresh_frame(c, owner, *ours))
            .map(|frame| self.wire.send(c.ifindex, &frame));
        let ok = matches!(sent, Some(Ok(())));
        if log {
            let evidence = match known {
                OwnerMac::Certain { evidence, .. } => evidence.as_str(),
                OwnerMac::Uncertain(_) => "",
            };
            tracing::info!(
                target: "arp_guard::refresh",
                lb_ip = %c.ip, client_mac = %fmt_mac(&c.mac), client_ip = %c.client_ip,
                owner_mac = %fmt_mac(&owner), evidence,
                error = ?sent.as_ref().and_then(|r| r.as_ref().err()),
                "{}",
                if ok { "stale client refreshed: taught the owner's MAC" } else { "stale client refresh not sent" }
            );
        }
        if ok {
            "sent"
        } else {
            "send_failed"
        }
    }
}

/// What one read's decisions are made from.
struct Read<'a> {
    k: Knowledge,
    claimants: BTreeMap<IpAddr, Vec<Claimant>>,
    /// This node's MACs by interface, and as a set.
    local: BTreeMap<u32, [u8; 6]>,
    local_set: BTreeSet<[u8; 6]>,
    ips: &'a BTreeMap<IpAddr, IpState>,
    hold_ns: u64,
}

impl Read<'_> {
    /// What the decision needs about `e`'s IP.
    fn facts(&self, e: &Entry) -> RefreshFacts<'_> {
        let state = self.ips.get(&e.ip);
        // Claims count from the move (this node's loss of the IP, or the
        // owner's change as this node saw it, the later) less the hold
        // window (the new owner may announce before the feed says so).
        let moved = state
            .and_then(|s| s.lost_ns)
            .max(self.k.changed_ns.get(&e.ip).copied());
        let Some(since) = moved.map(|m| m.saturating_sub(self.hold_ns)) else {
            return RefreshFacts {
                state: state.map_or(Ownership::Unknown, |s| s.state),
                blind: self.k.blind,
                owner: OwnerMac::Uncertain("the moment of the move is not known"),
                local: &self.local_set,
            };
        };
        let claimants = self.claimants.get(&e.ip).map_or(&[][..], Vec::as_slice);
        let census = match &self.k.claims {
            None => OwnerMac::Uncertain("no census read yet"),
            Some(_) => owner_from_census(
                claimants,
                self.k.conflicts.contains(&e.ip),
                since,
                &self.local_set,
            ),
        };
        let none = BTreeSet::new();
        // Presence stands beside a census that was read, never in its place.
        let owner = match (&self.k.presence, &self.k.claims) {
            (Some(p), Some(_)) => owner_with_presence(
                census,
                claimants,
                since,
                &self.local_set,
                Presence {
                    owner: p.owner_macs.get(&e.ip).unwrap_or(&none),
                    uplink_macs: &p.uplink_macs,
                },
            ),
            _ => census,
        };
        RefreshFacts {
            state: state.map_or(Ownership::Unknown, |s| s.state),
            blind: self.k.blind,
            owner,
            local: &self.local_set,
        }
    }
}

/// The census's claimants of each IP in `ips`, in one pass over its claims.
fn claimants_of(k: &Knowledge, ips: BTreeSet<IpAddr>) -> BTreeMap<IpAddr, Vec<Claimant>> {
    let mut out: BTreeMap<IpAddr, Vec<Claimant>> = BTreeMap::new();
    for c in k.claims.iter().flat_map(|v| v.iter()) {
        if ips.contains(&c.ip) {
            out.entry(c.ip).or_default().push(Claimant {
                mac: c.mac,
                first_ns: c.first_ns,
                last_ns: c.last_ns,
            });
        }
    }
    out
}

/// When each IP took its current state and source (for a Kubernetes or
/// file source, its owner), from `dated` (IP, Unix seconds), on the
/// monotonic clock: taken at the start of that second (claims a little
/// before the change may count, never fewer after it).
pub fn changed_ns(
    dated: impl Iterator<Item = (IpAddr, u64)>,
    now_ns: u64,
) -> BTreeMap<IpAddr, u64> {
    let now_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    dated
        .map(|(ip, since_unix)| {
            let ago_ns = ((now_unix - since_unix as f64).max(0.0) * 1e9) as u64;
            (ip, now_ns.saturating_sub(ago_ns))
        })
        .collect()
}
