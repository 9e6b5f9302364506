//! What the operator sees: the kernel counters, the drop events, the
//! daemon's status document and operation counters, and the Prometheus
//! rendering of all of it.

pub mod catalogue;
pub mod census;
pub mod clients;
mod clients_metrics;
pub mod counters;
pub mod events;
mod family;
mod feed_metrics;
mod fold;
pub mod histogram;
pub mod memory;
pub mod metrics;

pub mod probing;

pub mod status;
pub mod takeover;

use guard_common::{Kind, Origin, Ownership, Verdict};

/// The names of a kernel decision's fields as the counter map and the event
/// ring spell them (`u8`s): kind, origin, state, verdict; "?" for a value
/// this build does not know (a newer program left pinned).
fn decision_names(kind: u8, origin: u8, state: u8, verdict: u8) -> [String; 4] {
    [
        Kind::from_u8(kind).map_or("?", Kind::as_str),
        Origin::from_u8(origin).map_or("?", Origin::as_str),
        Ownership::from_u8(state).map_or("?", Ownership::as_str),
        Verdict::from_u8(verdict).map_or("?", Verdict::as_str),
    ]
    .map(String::from)
}

/// An interface's name, or `ifindex:N` once it is gone.
fn interface_name(ifindex: u32) -> String {
    crate::datapath::sys::ifname(ifindex).unwrap_or_else(|| format!("ifindex:{ifindex}"))
}
