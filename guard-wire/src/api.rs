//! The documents a guard's local API serves (`/status`, `/explain`,
//! `/events`), read back by its CLI and, through pods/exec, by `kubectl
//! arp-guard`.

use std::{collections::BTreeMap, net::IpAddr};

use guard_common::{Kind, LeakAction, Mode, Origin, Ownership, Verdict};
use serde::{Deserialize, Serialize};

use crate::{
    census::{CensusDoc, Reason},
    clients::ClientsDoc,
    status::DaemonStatus,
    takeover::TakeoverRecord,
};

/// One LB IP as the daemon currently treats it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IpEntry {
    pub state: Ownership,
    /// Which object or line said so.
    pub source: String,
    /// When this state and source were first seen (Unix seconds).
    pub since_unix: u64,
    /// Uplinks that carry the IP themselves (IPv4 only: the egress-address
    /// rule is ARP's).
    pub on_interfaces: Vec<String>,
    /// The Service that carries it (namespace/name), when the cluster feed
    /// says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The owner node the source names (None: none known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Services share the IP and their announcer elected different nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<SplitElection>,
}

/// An LB IP shared by Services that were elected separately (one Lease
/// per Service: Cilium, kube-vip; or MetalLB statuses naming different
/// nodes) and whose records name different nodes: each of those nodes
/// announces it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitElection {
    /// Every Service sharing the IP, by namespace/name.
    pub services: Vec<SharedService>,
    /// `--settle-shared-ips`: the node treated as the owner, the others'
    /// announcements and replies stopped as for any foreign IP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_on: Option<String>,
    /// Why it is or is not settled, in words.
    #[serde(default)]
    pub settle: String,
}

impl SplitElection {
    /// One line: each Service with its holder, and the node kept.
    pub fn summary(&self) -> String {
        let named: Vec<String> = (self.services.iter())
            .map(|x| format!("{}={}", x.service, x.holder.as_deref().unwrap_or("-")))
            .collect();
        match &self.settled_on {
            Some(n) => format!("{}  kept on {n}", named.join(" ")),
            None => format!("{}  not settled", named.join(" ")),
        }
    }

    /// The distinct nodes the Services' records name.
    pub fn holders(&self) -> Vec<&str> {
        let mut h: Vec<&str> = (self.services.iter())
            .filter_map(|s| s.holder.as_deref())
            .collect();
        h.sort_unstable();
        h.dedup();
        h
    }
}

/// One Service sharing a split LB IP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedService {
    pub service: String,
    /// The node its record names (None: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// The record, in the feed's words (which Lease or status).
    pub record: String,
    /// `externalTrafficPolicy: Local`: only nodes with its endpoints serve it.
    #[serde(default)]
    pub local: bool,
}

/// `/status`: the daemon's status document, readiness, and a row per LB IP.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusDoc {
    /// The daemon's version (`arp-guard --version`): a rolling update's
    /// mixed versions show in `kubectl arp-guard status`.
    #[serde(default)]
    pub version: String,
    #[serde(flatten)]
    pub status: Option<DaemonStatus>,
    pub ready: bool,
    pub not_ready: Vec<String>,
    pub ips: Vec<IpRow>,
    /// LB IPs claimed by more than one MAC, or owned here and claimed by
    /// another (from the responder census; empty when it is off).
    #[serde(default)]
    pub conflicts: Vec<ConflictRow>,
    /// Whether the census runs, and how full its table is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub census: Option<CensusSummary>,
    /// Takeovers by this node and the announcements held for them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub takeovers: Option<TakeoverSummary>,
    /// LB IPs foreign here whose clients still send here (from the client
    /// census; `arp-guard clients IP` for the detail).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clients: Vec<ClientsRow>,
}

impl StatusDoc {
    /// Only the LB IPs this node has something to say about: owned here,
    /// in conflict, or with misdirected clients (`status --brief`: what
    /// `kubectl arp-guard status` asks each node, small on every node but
    /// an IP's owner).
    pub fn brief(mut self) -> Self {
        let said: std::collections::BTreeSet<IpAddr> = (self.conflicts.iter().map(|c| c.ip))
            .chain(self.clients.iter().map(|c| c.ip))
            .collect();
        self.ips.retain(|r| {
            r.entry.state == Ownership::Owned || r.entry.split.is_some() || said.contains(&r.ip)
        });
        self
    }

    /// Only `ip`'s rows.
    pub fn only(mut self, ip: IpAddr) -> Self {
        self.ips.retain(|r| r.ip == ip);
        self.conflicts.retain(|c| c.ip == ip);
        self.clients.retain(|c| c.ip == ip);
        self
    }
}

/// One LB IP whose clients still send to this node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientsRow {
    pub ip: IpAddr,
    /// Clients still sending here, and the stale ones among them.
    pub sending: usize,
    pub stale: usize,
    /// Seconds since this node lost the IP (after a move).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_ago_s: Option<u64>,
}

impl ClientsRow {
    /// The IPs of a clients document that still have clients sending.
    pub fn all<S>(d: &ClientsDoc<S>) -> Vec<ClientsRow> {
        (d.ips.iter())
            .filter(|(_, c)| c.sending > 0)
            .map(|(ip, c)| ClientsRow {
                ip: *ip,
                sending: c.sending,
                stale: c.stale,
                moved_ago_s: c.moved_ago_s,
            })
            .collect()
    }
}

/// Takeovers by this node, in sum.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TakeoverSummary {
    /// LB IPs that became owned here since the daemon started.
    pub takeovers: u64,
    /// Of them, with no announcement within --silent-takeover-after.
    pub silent: u64,
    /// Announcements held now, waiting for a takeover.
    pub held_now: usize,
    /// Held announcements by outcome (deferred, replayed, expired, ...).
    pub announcements: BTreeMap<String, u64>,
}

/// One LB IP in conflict.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConflictRow {
    pub ip: IpAddr,
    pub reason: Reason,
    /// The MACs that claimed it within the window, most recent first.
    pub macs: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CensusSummary {
    pub window_seconds: u64,
    pub entries: usize,
    pub capacity: u32,
    /// LB IPs with a claim within the window.
    pub ips_claimed: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Clients still sending here for LB IPs that are foreign here, and
    /// the stale ones among them (`arp-guard clients`).
    #[serde(default)]
    pub misdirected_clients: usize,
    #[serde(default)]
    pub stale_clients: usize,
}

impl CensusSummary {
    pub fn of<C, S>(d: &CensusDoc<C>, clients: Option<&ClientsDoc<S>>) -> Self {
        let ips = clients.map(|c| c.ips.values());
        CensusSummary {
            window_seconds: d.window_seconds,
            entries: d.entries,
            capacity: d.capacity,
            ips_claimed: d.ips.values().filter(|c| c.active > 0).count(),
            error: d.error.clone(),
            misdirected_clients: ips.clone().map_or(0, |i| i.map(|c| c.sending).sum()),
            stale_clients: ips.map_or(0, |i| i.map(|c| c.stale).sum()),
        }
    }
}

impl ConflictRow {
    /// The conflicts of a census.
    pub fn all<C>(d: &CensusDoc<C>) -> Vec<ConflictRow> {
        d.ips
            .iter()
            .filter_map(|(ip, c)| {
                c.conflict.map(|reason| ConflictRow {
                    ip: *ip,
                    reason,
                    macs: c
                        .responders
                        .iter()
                        .filter(|r| r.active)
                        .map(|r| r.mac.clone())
                        .collect(),
                })
            })
            .collect()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IpRow {
    pub ip: IpAddr,
    /// "ipv4" (guarded in ARP) or "ipv6" (guarded in Neighbor Discovery).
    #[serde(default)]
    pub family: String,
    #[serde(flatten)]
    pub entry: IpEntry,
    /// Decisions counted for this IP, by verdict.
    pub counters: BTreeMap<Verdict, u64>,
    /// Its last takeover by this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub takeover: Option<TakeoverRecord>,
}

/// `/explain?ip=`: why this node treats an IP as it does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Explanation {
    pub ip: IpAddr,
    #[serde(default)]
    pub family: String,
    /// Whether the IP is in this node's LB set at all.
    pub lb_ip: bool,
    pub state: Option<Ownership>,
    pub source: Option<String>,
    pub known_for_seconds: Option<u64>,
    pub mode: Option<Mode>,
    pub leak_action: Option<LeakAction>,
    pub heartbeat: String,
    /// Its last takeover by this node: when, and how long until the first
    /// announcement left (or that none did: a silent takeover).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub takeover: Option<TakeoverRecord>,
    /// Services share the IP and were elected separately.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<SplitElection>,
    /// What the program would do with each kind of frame of the IP's
    /// family (ARP or NDP) from each origin, leaving through each guarded
    /// interface.
    pub would: Vec<Would>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Would {
    pub interface: String,
    pub kind: Kind,
    pub origin: Origin,
    pub verdict: Verdict,
}

/// A line of `/events` that is not an event: the reader fell behind.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Lagged {
    pub lagged: u64,
}
