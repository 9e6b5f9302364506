//! The active census's verdicts in Kubernetes' words (`model::probing`
//! decides them; the node that asked reports them).

use std::net::IpAddr;

use super::{Occurrence, Reason};
use crate::model::probing::ProbingVerdict;

/// A verdict of the active census, in the words of the node that asked.
#[allow(clippy::too_many_arguments)]
pub(super) fn probe(
    ip: IpAddr,
    verdict: ProbingVerdict,
    ended: bool,
    owner: Option<&str>,
    answered_by: &[String],
    unanswered: u64,
    interface: &str,
    node: &str,
) -> Option<Occurrence> {
    let owner_name = owner.unwrap_or("its owner");
    let who = answered_by.join(", ");
    let (reason, note, at_fault) = match (verdict, ended) {
        (ProbingVerdict::Conflict, false) => (
            Reason::ResponderConflict,
            format!("more than one MAC answered one ARP/NDP request for {ip} from {node}: {who}; the owner is {owner_name}: split brain, a device outside the cluster, or a node answering that should not"),
            None,
        ),
        (ProbingVerdict::Conflict, true) => (
            Reason::ResponderConflictResolved,
            format!("one MAC answers {node}'s requests for {ip} again: {who}"),
            None,
        ),
        (ProbingVerdict::SilentOwner, false) => (
            Reason::SilentOwner,
            if answered_by.is_empty() {
                format!("{owner_name} owns {ip} but nobody answered {unanswered} requests in a row from {node}: clients that ask get no answer (is the announcer on {owner_name} running, and the IP on its interface?)")
            } else {
                format!("{owner_name} owns {ip} but did not answer {unanswered} requests in a row from {node}; only {who} did: clients that ask are sent elsewhere")
            },
            owner.map(str::to_owned),
        ),
        (ProbingVerdict::WrongInterface, false) => (
            Reason::OwnerWrongInterface,
            format!("{owner_name} answers for {ip} from its interface {interface} ({who}), which arp-guard does not guard: a bond slave or a second NIC; add it to --interface or fix the announcer's interface"),
            owner.map(str::to_owned),
        ),
        // The end of silence or of a wrong interface: the log says it; an
        // IP answered or not judged yet makes no Event.
        (_, true) | (ProbingVerdict::Pending | ProbingVerdict::Answered, _) => return None,
    };
    Some(Occurrence {
        reason,
        note,
        node_at_fault: at_fault,
    })
}
