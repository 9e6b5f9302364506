//! Who answers for each LB IP, as a guard's census reports it (`/responders`,
//! and the conflicts of `/status`); the judging is the daemon's
//! (`guard::model::census`).

use std::{collections::BTreeMap, net::IpAddr};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Claimed by more than one MAC at a time.
    Contested,
    /// Owned by this node, claimed by another MAC.
    ClaimedElsewhere,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Contested => "contested",
            Reason::ClaimedElsewhere => "claimed_elsewhere",
        }
    }
}

/// One MAC that claimed an IP, as the API and CLI show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Responder {
    pub mac: String,
    pub claims: u64,
    /// Seconds since its current run of claims began, and since its latest.
    pub first_seen_ago_s: u64,
    pub last_seen_ago_s: u64,
    /// Claimed within the window.
    pub active: bool,
    /// One of this node's own MACs.
    pub local: bool,
    pub kinds: Vec<String>,
    /// The interface its latest claim arrived on.
    pub interface: String,
    /// The guarded node whose interface has this MAC (presence), and which.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_interface: Option<String>,
    /// No live guard lists this MAC: a device outside the cluster, or a
    /// node without the guard (only said while presence runs).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub outside: bool,
}

/// The census of one LB IP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpCensus {
    /// MACs that claimed it within the window.
    pub active: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflict: Option<Reason>,
    /// The owner node the ownership source names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Most recent first, at most `guard::model::census::MAX_LISTED` (a
    /// flood of forged MACs cannot make the document huge).
    pub responders: Vec<Responder>,
    /// Responders not listed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Every LB IP with a claim in the table.
pub type Census = BTreeMap<IpAddr, IpCensus>;

/// The census as the API serves it (`/responders`).
///
/// `C`: what the daemon keeps beside the document and never serves (the
/// claims as read, for the healer of stale clients); a reader has `()`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CensusDoc<C = ()> {
    /// Claims older than this are history.
    pub window_seconds: u64,
    /// Entries in the kernel table, and its capacity (LRU: the least recently
    /// claimed make room).
    pub entries: usize,
    pub capacity: u32,
    /// Census totals from the kernel (arp, ndp, claims, insert_failed).
    pub totals: BTreeMap<String, u64>,
    /// The table could not be read (the last good census is kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Every LB IP with a claim.
    pub ips: Census,
    /// The daemon's own (`C`): not served.
    #[serde(skip)]
    pub claims: C,
}
