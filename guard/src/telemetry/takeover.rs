//! What the daemon tells of takeovers: held announcements and their fate,
//! and how long each takeover took to its first announcement. Kept by the
//! main loop, copied into the API's state when it changes, rendered by
//! `metrics.rs`.

use std::collections::BTreeMap;

use super::histogram::Histogram;

/// The fates of a held announcement (the `outcome` label of
/// `arp_guard_announce_total`).
pub const OUTCOMES: &[&str] = &[
    // Copied by the program and received by the daemon.
    "deferred",
    // Re-sent once the IP was owned here.
    "replayed",
    // Split brain: the IP did not become owned here within
    // --split-brain-after (at least --announce-hold) of the frame.
    "expired",
    // Owned here after --announce-hold but within --split-brain-after: the
    // ownership feed was late (a held frame had been given up, not re-sent).
    "late",
    // Not held but noted (a speaker's frame that passed in monitor mode, a
    // reply, which is never held): its fate is one of in_time, late, expired.
    "noted",
    // A noted frame whose IP became owned here within --announce-hold: the
    // takeover's own.
    "in_time",
    // The same bytes were held already (an announcer repeating itself): the
    // copy is renewed, and the repeat's fate is one of in_time, late, expired.
    "duplicate",
    // The daemon's store was full (or its queue from the reader).
    "overflow",
    // The re-send failed (the interface went away, a full queue).
    "replay_failed",
    // Not sent by this node (its Ethernet source is not one of this node's
    // MACs: a frame forwarded through a bridge here): never re-sent.
    "not_local",
];

#[derive(Debug, Clone, Default, PartialEq)]
pub struct TakeoverStats {
    /// Held announcements by outcome ([`OUTCOMES`]).
    pub held: BTreeMap<&'static str, u64>,
    /// Announcements held now.
    pub holding: usize,
    /// IPs that became owned here.
    pub takeovers: u64,
    /// Takeovers with no announcement within the threshold.
    pub silent: u64,
    /// From a held announcement's drop to its re-send: what the guard adds
    /// to a takeover.
    pub replay_delay: Histogram,
    /// From the ownership change to the first announcement that left.
    pub first_announcement: Histogram,
}

impl TakeoverStats {
    pub fn count(&mut self, outcome: &'static str, n: u64) {
        debug_assert!(OUTCOMES.contains(&outcome));
        *self.held.entry(outcome).or_default() += n;
    }
}
