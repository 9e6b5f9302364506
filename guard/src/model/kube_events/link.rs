//! An owner whose uplinks have all lost carrier while its announcer's
//! record still names it (the announce NIC down, the agent renewing its
//! Lease over another): told by the owner itself, on each Service it owns,
//! once when it starts and once when a link returns.

use std::net::IpAddr;

use super::{Occurrence, Reason};

/// The Warning on the Service of `ip`, owned by `node` by `record`, whose
/// uplinks `down` all lack carrier.
pub fn owner_link_down(node: &str, ip: IpAddr, down: &[String], record: &str) -> Occurrence {
    let (iface, has) = match down {
        [one] => (format!("uplink {one}"), "has"),
        _ => (format!("uplinks {}", down.join(", ")), "have"),
    };
    Occurrence {
        reason: Reason::OwnerLinkDown,
        note: format!(
            "{node} owns {ip} ({record}) but its {iface} {has} no carrier: its announcements and replies cannot reach the segment, and clients that ask get no answer, while the record still names {node} and no other node takes over. Fix: the cable, the switch port or the NIC of {node}; or move the IP (let {node} lose its Lease: stop the announcer there)"
        ),
        node_at_fault: Some(node.to_owned()),
    }
}

/// The Normal Event when carrier is back on an uplink of the owner.
pub fn owner_link_restored(node: &str, ip: IpAddr, up: &[String]) -> Occurrence {
    Occurrence {
        reason: Reason::OwnerLinkRestored,
        note: format!(
            "{node} owns {ip} and has carrier again on {}",
            up.join(", ")
        ),
        node_at_fault: None,
    }
}
