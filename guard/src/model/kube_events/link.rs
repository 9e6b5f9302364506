//! An owner whose uplinks have all lost carrier while its announcer's
//! record still names it (the announce NIC down, the agent renewing its
//! Lease over another): told by the owner itself, on each Service it owns,
//! once when it starts and once when a link returns.
//!
//! [`LinkEpisodes`] keeps what was told and what is still owed. The end (a
//! Normal Event) goes only once its Warning went, so that whoever reads the
//! Events (`kubectl arp-guard status` takes a Warning ended by a later
//! Normal as history) sees them in order; a Warning that could not go while
//! the link was down (it was the way to the API too) goes when it returns,
//! also when the IP moved to another node meanwhile (the node lost its
//! Lease: the operator still learns why).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use super::{Occurrence, Reason};

/// Services followed at once; more are not told (a node owns few).
pub const MAX_SERVICES: usize = 4096;
/// A Warning told late is tried this many times (each at most once per
/// `--kube-events-interval`), then given up with its end.
const LATE_TRIES: u8 = 3;

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

/// The Normal Event that ends an episode: carrier back on `up`, or (`owner`
/// false) the IP no longer this node's.
pub fn owner_link_restored(node: &str, ip: IpAddr, up: &[String], owner: bool) -> Occurrence {
    let note = match (owner, up.is_empty()) {
        (true, _) => format!("{node} owns {ip} and has carrier again on {}", up.join(", ")),
        (false, false) => format!(
            "{node} has carrier again on {}; {ip} is no longer its own (its record names another node now)",
            up.join(", ")
        ),
        (false, true) => format!(
            "{node} no longer owns {ip} (its record names another node now): its uplinks' lost carrier no longer keeps {ip} from its clients"
        ),
    };
    Occurrence {
        reason: Reason::OwnerLinkRestored,
        note,
        node_at_fault: None,
    }
}

/// Where a Service's Warning is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// Handed to the publisher, no word yet.
    InFlight,
    Sent,
    /// Failed, timed out or dropped.
    Unsent,
}

/// A Service told (or being told) that its owner, this node, lost carrier.
#[derive(Debug)]
struct Told {
    ip: IpAddr,
    warning: Occurrence,
    delivery: Delivery,
}

/// Carrier is back: what is still owed to a Service.
#[derive(Debug)]
struct Closing {
    /// The Warning, said to be late.
    late: Occurrence,
    /// The end, once the Warning went.
    end: Occurrence,
    /// Times `late` was handed over.
    tries: u8,
}

/// The episodes of this node's lost carrier, per Service.
#[derive(Debug, Default)]
pub struct LinkEpisodes {
    down: BTreeMap<String, Told>,
    closing: BTreeMap<String, Closing>,
}

/// Occurrences to offer, by Service.
pub type Offers = Vec<(String, Occurrence)>;

impl LinkEpisodes {
    /// Carrier is off on every uplink and this node owns `owned` (Service,
    /// IP, the record that names it): the Warning for each not yet told.
    pub fn down(
        &mut self,
        node: &str,
        owned: &[(String, IpAddr, String)],
        down: &[String],
    ) -> Offers {
        let mut out = Vec::new();
        for (svc, ip, record) in owned {
            if self.down.contains_key(svc) || self.down.len() >= MAX_SERVICES {
                continue;
            }
            // Down again before the last episode's end went: this one's
            // end will tell it.
            self.closing.remove(svc);
            let warning = owner_link_down(node, *ip, down, record);
            out.push((svc.clone(), warning.clone()));
            let told = Told {
                ip: *ip,
                warning,
                delivery: Delivery::InFlight,
            };
            self.down.insert(svc.clone(), told);
        }
        out
    }

    /// The episode is over (carrier back on `up`, or this node owns none
    /// of the IPs any more; `owned`: what it owns now): each Service's end,
    /// or its Warning first where that has not gone.
    pub fn up(&mut self, node: &str, owned: &BTreeSet<IpAddr>, up: &[String]) -> Offers {
        let mut out = Vec::new();
        for (svc, t) in std::mem::take(&mut self.down) {
            let owner = owned.contains(&t.ip);
            let end = owner_link_restored(node, t.ip, up, owner);
            if t.delivery == Delivery::Sent {
                out.push((svc, end));
                continue;
            }
            let mut late = t.warning;
            late.note
                .push_str(" (told late: the API could not be reached while the link was down");
            if !owner {
                late.note
                    .push_str(&format!("; {} has since moved to another node", t.ip));
            }
            late.note.push(')');
            let mut tries = 0;
            // In flight: its word decides (sent: the end; not: late).
            if t.delivery == Delivery::Unsent {
                out.push((svc.clone(), late.clone()));
                tries = 1;
            }
            self.closing.insert(svc, Closing { late, end, tries });
        }
        out
    }

    /// What became of a Warning handed over for `svc` (published or not):
    /// what to offer next.
    pub fn outcome(&mut self, svc: &str, published: bool) -> Offers {
        if let Some(t) = self.down.get_mut(svc) {
            t.delivery = if published {
                Delivery::Sent
            } else {
                Delivery::Unsent
            };
            return Vec::new();
        }
        let Some(c) = self.closing.get_mut(svc) else {
            return Vec::new();
        };
        if !published && c.tries < LATE_TRIES {
            c.tries += 1;
            return vec![(svc.to_owned(), c.late.clone())];
        }
        let Some(c) = self.closing.remove(svc) else {
            return Vec::new();
        };
        // Given up: its end would end nothing the reader saw.
        if !published {
            return Vec::new();
        }
        vec![(svc.to_owned(), c.end)]
    }

    /// Whether an episode is on.
    pub fn is_down(&self) -> bool {
        !self.down.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IP: &str = "198.51.100.100";

    fn ip() -> IpAddr {
        IP.parse().unwrap()
    }

    fn owned() -> Vec<(String, IpAddr, String)> {
        vec![("default/web".into(), ip(), "Lease x".into())]
    }

    fn reasons(o: &Offers) -> Vec<Reason> {
        o.iter().map(|(_, o)| o.reason).collect()
    }

    #[test]
    fn told_once_then_ended_when_carrier_returns() {
        let mut l = LinkEpisodes::default();
        let d = l.down("node-a", &owned(), &["eth0".into()]);
        assert_eq!(reasons(&d), [Reason::OwnerLinkDown]);
        assert!(
            l.down("node-a", &owned(), &["eth0".into()]).is_empty(),
            "once"
        );
        assert!(l.outcome("default/web", true).is_empty());
        let up = l.up("node-a", &BTreeSet::from([ip()]), &["eth0".into()]);
        assert_eq!(reasons(&up), [Reason::OwnerLinkRestored]);
        assert!(up[0].1.note.contains("has carrier again on eth0"));
        assert!(!l.is_down());
    }

    /// The only link was the way to the API: the Warning failed; when the
    /// link returns it goes first (said late, and that the IP moved), and
    /// its end only once it went.
    #[test]
    fn a_warning_that_could_not_go_goes_first_when_the_link_returns() {
        let mut l = LinkEpisodes::default();
        l.down("node-a", &owned(), &["eth0".into()]);
        assert!(l.outcome("default/web", false).is_empty());
        let up = l.up("node-a", &BTreeSet::new(), &["eth0".into()]);
        assert_eq!(reasons(&up), [Reason::OwnerLinkDown]);
        let note = &up[0].1.note;
        assert!(
            note.contains("told late") && note.contains("moved to another node"),
            "{note}"
        );
        let end = l.outcome("default/web", true);
        assert_eq!(reasons(&end), [Reason::OwnerLinkRestored]);
        assert!(
            end[0].1.note.contains("no longer its own"),
            "{}",
            end[0].1.note
        );
        assert!(l.outcome("default/web", true).is_empty(), "ended once");
    }

    /// Still in flight when carrier returned: its word decides.
    #[test]
    fn in_flight_at_the_return_sent_ends_unsent_is_told_late() {
        let mut l = LinkEpisodes::default();
        l.down("node-a", &owned(), &["eth0".into()]);
        assert!(l
            .up("node-a", &BTreeSet::from([ip()]), &["eth0".into()])
            .is_empty());
        let next = l.outcome("default/web", false);
        assert_eq!(reasons(&next), [Reason::OwnerLinkDown]);
        let end = l.outcome("default/web", true);
        assert_eq!(reasons(&end), [Reason::OwnerLinkRestored]);

        l.down("node-a", &owned(), &["eth0".into()]);
        assert!(l
            .up("node-a", &BTreeSet::from([ip()]), &["eth0".into()])
            .is_empty());
        assert_eq!(
            reasons(&l.outcome("default/web", true)),
            [Reason::OwnerLinkRestored]
        );
    }

    /// Never an end for a Warning nobody saw, and never for ever.
    #[test]
    fn a_late_warning_is_given_up_after_its_tries_without_an_end() {
        let mut l = LinkEpisodes::default();
        l.down("node-a", &owned(), &["eth0".into()]);
        l.outcome("default/web", false);
        assert_eq!(l.up("node-a", &BTreeSet::from([ip()]), &[]).len(), 1);
        for _ in 1..LATE_TRIES {
            assert_eq!(
                reasons(&l.outcome("default/web", false)),
                [Reason::OwnerLinkDown]
            );
        }
        assert!(l.outcome("default/web", false).is_empty());
        assert!(l.outcome("default/web", true).is_empty());
    }

    /// Down again before the last end went: the new episode's end tells it.
    #[test]
    fn down_again_supersedes_what_the_last_episode_owed() {
        let mut l = LinkEpisodes::default();
        l.down("node-a", &owned(), &["eth0".into()]);
        l.outcome("default/web", false);
        l.up("node-a", &BTreeSet::from([ip()]), &["eth0".into()]);
        let again = l.down("node-a", &owned(), &["eth0".into()]);
        assert_eq!(reasons(&again), [Reason::OwnerLinkDown]);
        assert!(!again[0].1.note.contains("told late"));
        // The word on the new Warning, not the old one's end.
        assert!(l.outcome("default/web", true).is_empty());
        assert!(l.is_down());
    }
}
