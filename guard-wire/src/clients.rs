//! Misdirected and stale clients, as a guard reports them (`/clients`, and
//! the rows of `/status`); the judging is the daemon's
//! (`guard::model::clients`).

use std::{collections::BTreeMap, net::IpAddr, time::Duration};

use guard_common::{Ownership, MAX_CLIENTS};
use serde::{Deserialize, Serialize};

use crate::histogram::Histogram;

/// Why a client's packets for an IP come here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// This node owned the IP and lost it; the client has not followed.
    AfterMove,
    /// This node has not owned the IP (since the daemon started).
    NotOwnedHere,
}

impl Cause {
    pub const ALL: &'static [Cause] = &[Cause::AfterMove, Cause::NotOwnedHere];

    pub fn as_str(self) -> &'static str {
        match self {
            Cause::AfterMove => "after_move",
            Cause::NotOwnedHere => "not_owned_here",
        }
    }
}

/// Where a client stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientState {
    /// Still sending here, for longer than `stale_after`.
    Stale,
    /// Still sending here, not yet for `stale_after`: it may still follow.
    Sending,
    /// Quiet here for `stale_after`: it followed the move (or stopped).
    Gone,
}

impl ClientState {
    pub fn as_str(self) -> &'static str {
        match self {
            ClientState::Stale => "stale",
            ClientState::Sending => "sending",
            ClientState::Gone => "gone",
        }
    }
}

/// One client of an LB IP, as the API and CLI show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Client {
    pub mac: String,
    /// The IP source of its latest packet here.
    pub client_ip: IpAddr,
    pub status: ClientState,
    /// Packets here since the move (not owned here: of its current entry).
    pub packets: u64,
    /// Seconds since its first packet of this episode, and since its latest.
    pub first_seen_ago_s: u64,
    pub last_seen_ago_s: u64,
    /// Seconds from the move (not owned here: from its first packet) to its
    /// latest packet here: how long it has been misdirected.
    pub misdirected_s: f64,
    /// After a move, once gone: its failover time as it lived it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover_s: Option<f64>,
    /// The interface its latest packet arrived on, and the VLAN tag it had.
    pub interface: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
}

/// The clients of one LB IP.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IpClients {
    /// This node's state for the IP now (clients are listed while `foreign`).
    pub state: Ownership,
    /// While `foreign`: why clients come here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    /// Seconds since this node lost the IP (after a move).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_ago_s: Option<u64>,
    /// Misdirected packets counted for it since the daemon started.
    pub packets_total: u64,
    /// Clients still sending here (stale or not yet), and the stale ones.
    pub sending: usize,
    pub stale: usize,
    /// The longest a stale client has been misdirected (`misdirected_s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_stale_s: Option<f64>,
    /// Stale first, then still sending, then gone; latest first; at most
    /// `guard::model::census::MAX_LISTED`.
    pub clients: Vec<Client>,
    /// Clients not listed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Every LB IP with misdirected packets.
pub type Clients = BTreeMap<IpAddr, IpClients>;

/// `/clients`: misdirected and stale clients per LB IP.
///
/// `S`: what the daemon keeps beside the document and never serves (the
/// per-LB-IP metric series chosen for it, bounded by
/// `--metrics-max-ip-series`); a reader has `()`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClientsDoc<S = ()> {
    /// `--stale-client-after`, in seconds.
    pub stale_after_seconds: f64,
    /// Entries in the kernel table, and its capacity (LRU: the least
    /// recently seen clients make room).
    pub entries: usize,
    pub capacity: u32,
    /// Totals from the kernel (recorded, new_client, insert_failed, other_host).
    pub totals: BTreeMap<String, u64>,
    /// The table could not be read (the last good state is kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Clients still sending here past `--stale-client-after`, all LB IPs.
    pub stale: usize,
    /// Failover times of the clients that followed a move (seconds).
    pub failover: Histogram,
    /// With `--refresh-stale-clients`: refreshes by outcome (`sent`,
    /// `send_failed`, or why not: `not_foreign`, `blind`,
    /// `owner_uncertain`, `own_mac`, `rate_limited`, `over_limit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refreshes: Option<BTreeMap<String, u64>>,
    /// Every LB IP with misdirected packets.
    pub ips: Clients,
    /// The daemon's own (`S`): not served.
    #[serde(skip)]
    pub series: S,
}

impl<S: Default + Clone> ClientsDoc<S> {
    /// An empty document: "on, nothing seen yet".
    pub fn empty(stale_after: Duration) -> Self {
        ClientsDoc {
            stale_after_seconds: stale_after.as_secs_f64(),
            capacity: MAX_CLIENTS,
            ..Default::default()
        }
    }

    /// The same document for one LB IP only.
    pub fn only(&self, ip: IpAddr) -> Self {
        ClientsDoc {
            ips: self
                .ips
                .get(&ip)
                .map(|c| (ip, c.clone()))
                .into_iter()
                .collect(),
            stale: self.ips.get(&ip).map_or(0, |c| c.stale),
            series: S::default(),
            ..self.clone()
        }
    }
}
