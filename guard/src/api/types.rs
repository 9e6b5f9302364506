//! The documents the API serves, shared with the CLI and `kubectl
//! arp-guard` that read them back (wire types: `guard_wire::api`), and how
//! the daemon sums its takeovers into them.

pub use guard_wire::api::{
    CensusSummary, ClientsRow, ConflictRow, Explanation, IpEntry, IpRow, Lagged, StatusDoc,
    TakeoverSummary, Would,
};

use crate::telemetry::takeover::TakeoverStats;

/// Takeovers by this node, in sum, as `/status` shows them.
pub fn takeover_summary(t: &TakeoverStats) -> TakeoverSummary {
    TakeoverSummary {
        takeovers: t.takeovers,
        silent: t.silent,
        held_now: t.holding,
        announcements: t.held.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
    }
}
