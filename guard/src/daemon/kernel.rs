//! This node's kernel answering ARP for LB IPs other nodes own, seen
//! first-hand from the program's reports (`origin="kernel"` replies of an
//! IP foreign here): when the IP is held on another interface than the one
//! the answer left by, only `arp_ignore=0` answers it (kube-proxy IPVS with
//! strictARP off). Not stopped (monitor mode), it goes into the state the
//! presence record and the Events read (`model::kube_events::kernel`).

use std::net::IpAddr;

use guard_common::{Kind, Ownership, Verdict};

use super::Daemon;
use crate::model::{
    kube_events::kernel::{answers_now, is_arp_ignore},
    takeover::Heard,
};

/// The state is written at most this often (ns): answers come by the
/// hundred a second on a busy segment.
const WRITE_EVERY_NS: u64 = 1_000_000_000;

impl Daemon {
    /// The program reported this node's kernel answering for an LB IP.
    pub(super) fn kernel_answered(&mut self, h: &Heard) {
        if h.kind != Kind::Reply {
            return;
        }
        let foreign = h.state == Ownership::Foreign;
        let stopped = h.verdict != Verdict::WouldDrop;
        if !is_arp_ignore(foreign, self.ip_on(h.ifindex, h.ip), stopped, h.ip) {
            return;
        }
        let last = self.shared.read().kernel_answered_ns;
        if last.is_some_and(|t| h.at_ns.saturating_sub(t) < WRITE_EVERY_NS) {
            return;
        }
        self.shared.write().kernel_answered_ns = Some(h.at_ns);
        if !answers_now(last, h.at_ns) {
            tracing::warn!(
                lb_ip = %h.ip,
                ifindex = h.ifindex,
                "this node's kernel answers ARP for an LB IP another node owns and holds elsewhere (arp_ignore=0: kube-proxy IPVS with strictARP off?); monitor mode lets it out. The IP's owner tells its Service (NodesAnswerARP); arp-guard doctor checks the sysctls"
            );
        }
    }

    /// Whether `ip` is on the interface `ifindex` or a VLAN device on it.
    fn ip_on(&self, ifindex: u32, ip: IpAddr) -> bool {
        let IpAddr::V4(v4) = ip else {
            return true;
        };
        let has = |i: u32| self.addrs.v4_of_index(i).iter().any(|a| a.addr == v4);
        has(ifindex) || self.addrs.vlans_on(ifindex).any(|(_, dev)| has(dev))
    }
}
