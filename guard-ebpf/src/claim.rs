//! An announcement of an LB IP, of either family, as the ARP and NDP
//! readers hand it to [`crate::act::act`], and the one way an event about
//! it is built.

use guard_common::{DropEvent, IpKey, Kind, LbEntry, Origin, Ownership, Verdict};

/// An announcement of an LB IP, of either family, ready to be judged.
pub(crate) struct OutgoingClaim {
    pub(crate) ip: IpKey,
    pub(crate) kind: Kind,
    /// The IP's entry in its LB map (non-null: a lookup's result); its
    /// state is read, its watch flag cleared once reported.
    pub(crate) entry: *mut LbEntry,
    pub(crate) requester_ip: IpKey,
    pub(crate) requester_mac: [u8; 6],
    /// The LB IP when it is IPv4 (host order), for the egress-address
    /// rule, which only ARP asks about; 0 for NDP (`ip` holds its address).
    pub(crate) lb_ipv4: u32,
    /// Where an announce leak's rewrite writes (ARP SPA).
    pub(crate) rewrite_at: usize,
    pub(crate) vlan_tags: u8,
    pub(crate) vids: [u16; 2],
}

impl OutgoingClaim {
    /// The event that tells the operator what became of this claim.
    #[inline(always)]
    pub(crate) fn event(
        &self,
        ifindex: u32,
        origin: Origin,
        state: Ownership,
        verdict: Verdict,
        at_ns: u64,
    ) -> DropEvent {
        DropEvent {
            lb_ip: self.ip,
            requester_ip: self.requester_ip,
            ifindex,
            requester_mac: self.requester_mac,
            kind: self.kind as u8,
            origin: origin as u8,
            state: state as u8,
            verdict: verdict as u8,
            _pad: [0; 2],
            at_ns,
        }
    }
}
