//! The decision table of arp-guard: the one place where a verdict is made.
//!
//! | state     | kernel origin                                   | speaker / redirect origin |
//! |-----------|-------------------------------------------------|---------------------------|
//! | `owned`   | pass                                            | pass                      |
//! | `foreign` | stop                                            | stop                      |
//! | `unknown` | stop, unless the LB IP is on the egress iface   | pass                      |
//!
//! What the guard's own daemon sends ([`Origin::Guard`]: held announcements
//! re-sent once the IP is owned here, refreshes for stale clients) passes.
//! "stop" means drop for replies and gratuitous ARP. For an announce leak it
//! means rewriting SPA to the egress interface's primary IPv4 (what
//! `arp_announce=2` would have chosen), which keeps the node able to resolve
//! its neighbour; when rewriting is disabled or the interface has no IPv4 the
//! leak is dropped. In `monitor` mode nothing is changed: the verdict says
//! what `enforce` would have done.

use crate::frame::{ArpFrame, ARPOP_REPLY, ARPOP_REQUEST};

/// What kind of announcement of an LB IP a frame is. Only frames whose SPA is
/// an LB IP are classified; everything else passes without a kind.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// op=2, SPA=LB IP, SPA != TPA: tells the requester "LB IP is at this MAC".
    Reply = 0,
    /// op=1 or 2 with SPA = TPA = LB IP: tells the whole segment.
    Gratuitous = 1,
    /// op=1, SPA=LB IP, SPA != TPA: an ordinary request that teaches the
    /// target "LB IP is at this MAC" (what arp_announce=2 prevents).
    AnnounceLeak = 2,
    /// IPv6: a Neighbor Advertisement with the Solicited flag, target = LB
    /// IP: the answer to one neighbour's solicitation.
    NaSolicited = 3,
    /// IPv6: a Neighbor Advertisement without it (usually with Override, to
    /// all nodes): a speaker taking the address over tells the segment.
    NaUnsolicited = 4,
    /// IPv6: a Neighbor Solicitation from an LB IP with a source link-layer
    /// address option, which teaches the target "LB IP is at this MAC" (the
    /// analogue of an announce leak; never rewritten, the frame is dropped).
    NsLeak = 5,
}

impl Kind {
    /// The kinds of IPv6 Neighbor Discovery.
    #[inline(always)]
    pub fn is_ndp(self) -> bool {
        matches!(self, Kind::NaSolicited | Kind::NaUnsolicited | Kind::NsLeak)
    }

    /// An announcement to the whole segment (gratuitous ARP, unsolicited
    /// NA): what an announcer sends when it takes an IP over. Replies and
    /// leaks answer or ask one neighbour, who asks again.
    #[inline(always)]
    pub fn is_announcement(self) -> bool {
        matches!(self, Kind::Gratuitous | Kind::NaUnsolicited)
    }
}

/// Who put the frame on the wire.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Origin {
    /// The kernel's own ARP stack: the skb carries no packet socket.
    Kernel = 0,
    /// A userspace announcer (MetalLB, kube-vip) writing through an AF_PACKET socket.
    Speaker = 1,
    /// A frame another program redirected out of the device it came in on
    /// (no socket of this node; the skb's ingress device is the egress one):
    /// a datapath responder such as Cilium's, which answers ARP from its TC
    /// ingress program and gates itself on its own ownership state. Judged
    /// like a speaker.
    Redirect = 2,
    /// The guard's own daemon: announcements it held back and re-sends once
    /// the IP is owned here, and the unicast refreshes it sends a stale
    /// client on the owner's behalf. Written through an AF_PACKET socket
    /// whose frames carry [`GUARD_MARK`]; the daemon sends only what it has
    /// judged, so these pass in every state.
    Guard = 3,
}

/// The `skb->mark` (SO_MARK) of the frames the guard's daemon sends itself
/// ([`Origin::Guard`]): "arpg" in ASCII, a value no other marker is likely
/// to set whole (Cilium, kube-proxy and Calico use a few bits each).
pub const GUARD_MARK: u32 = 0x6172_7067;

/// This node's relation to an LB IP.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ownership {
    Owned = 0,
    Foreign = 1,
    Unknown = 2,
}

#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    Enforce = 0,
    Monitor = 1,
}

/// What to do with an announce leak that must be stopped.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeakAction {
    /// Replace SPA with the egress interface's primary IPv4 (arp_announce=2).
    Rewrite = 0,
    Drop = 1,
}

/// How recently the daemon proved it is alive (its heartbeat in the maps).
/// A guard whose daemon died must not keep blocking on stale knowledge.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Liveness {
    /// Heartbeat fresh: the full policy applies.
    Fresh = 0,
    /// Heartbeat older than the stale threshold: `foreign` is judged as `unknown`.
    Stale = 1,
    /// Heartbeat older than the dead threshold (or never written): everything passes.
    Dead = 2,
}

/// Classify a heartbeat written at `heartbeat_ns` (CLOCK_MONOTONIC, as
/// `bpf_ktime_get_ns`) as seen at `now_ns`.
#[inline(always)]
pub fn liveness(
    now_ns: u64,
    heartbeat_ns: u64,
    stale_after_ns: u64,
    dead_after_ns: u64,
) -> Liveness {
    if heartbeat_ns == 0 {
        return Liveness::Dead;
    }
    let age = now_ns.saturating_sub(heartbeat_ns);
    if age >= dead_after_ns {
        Liveness::Dead
    } else if age >= stale_after_ns {
        Liveness::Stale
    } else {
        Liveness::Fresh
    }
}

/// The state the policy judges with: while the daemon's heartbeat is stale,
/// "another node owns it" may be old news, so foreign counts as unknown.
#[inline(always)]
pub fn effective_state(state: Ownership, live: Liveness) -> Ownership {
    match (state, live) {
        (Ownership::Foreign, Liveness::Stale) => Ownership::Unknown,
        (s, _) => s,
    }
}

/// What happened to the frame; this is the `verdict` counter label.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verdict {
    Passed = 0,
    Dropped = 1,
    WouldDrop = 2,
    Rewritten = 3,
    WouldRewrite = 4,
}

/// Everything the decision depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    pub kind: Kind,
    pub origin: Origin,
    pub state: Ownership,
    /// The LB IP is configured on the interface the frame leaves through.
    pub ip_on_egress: bool,
    /// The egress interface has a primary IPv4 to rewrite an announce leak with.
    pub egress_has_ipv4: bool,
    pub mode: Mode,
    pub leak_action: LeakAction,
    pub liveness: Liveness,
}

/// Name the kind of a frame whose SPA is an LB IP. `None` for opcodes that
/// announce nothing (the parser only lets requests and replies through).
#[inline(always)]
pub fn classify(arp: &ArpFrame) -> Option<Kind> {
    let same = arp.spa == arp.tpa;
    match arp.op {
        ARPOP_REPLY if same => Some(Kind::Gratuitous),
        ARPOP_REPLY => Some(Kind::Reply),
        ARPOP_REQUEST if same => Some(Kind::Gratuitous),
        ARPOP_REQUEST => Some(Kind::AnnounceLeak),
        _ => None,
    }
}

/// What an NDP message whose claimed address is an LB IP teaches its
/// receiver ([`classify_nd`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NdClass {
    /// An announcement of this kind.
    Announces(Kind),
    /// Nothing: a solicitation without a source link-layer address.
    Nothing,
    /// Its options are malformed: the receiver discards it.
    Malformed,
}

/// Name the kind of an NDP message whose claimed address is an LB IP:
/// advertisements by their Solicited flag; a solicitation only when it
/// carries a source link-layer address option (its receiver learns nothing
/// otherwise). Only a solicitation's options are read, from `r`, so the
/// caller asks after its LB lookup. The one place for the egress guard, the
/// census and the host reference.
#[inline(always)]
pub fn classify_nd<R: crate::frame::FrameReader + ?Sized>(
    r: &R,
    nd: &crate::frame::NdFrame,
) -> NdClass {
    if nd.is_advert() {
        return if nd.flags & crate::ndp::NA_FLAG_SOLICITED != 0 {
            NdClass::Announces(Kind::NaSolicited)
        } else {
            NdClass::Announces(Kind::NaUnsolicited)
        };
    }
    match crate::ndp::has_option(r, nd, crate::ndp::ND_OPT_SOURCE_LL) {
        Some(true) => NdClass::Announces(Kind::NsLeak),
        Some(false) => NdClass::Nothing,
        None => NdClass::Malformed,
    }
}

/// What the judgement of one frame needs from its surroundings, asked for
/// only when the verdict depends on it: the BPF program answers each with a
/// map lookup or a clock read, so an owned IP costs none of them and a
/// reply for a foreign IP never looks at the interface's addresses.
pub trait Surroundings {
    /// The daemon's heartbeat as seen now.
    fn liveness(&mut self) -> Liveness;
    /// The LB IP is configured on the interface the frame leaves through.
    fn ip_on_egress(&mut self) -> bool;
    /// The egress interface's primary IPv4 (host order), to rewrite an
    /// announce leak with.
    fn egress_primary(&mut self) -> Option<u32>;
}

/// The outcome of [`judge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Judgement {
    pub verdict: Verdict,
    /// The state the frame was judged with (foreign reads unknown while the
    /// heartbeat is stale): the `state` counter label.
    pub state: Ownership,
    /// The heartbeat, when it was consulted (never for an owned IP, which
    /// passes whatever it says).
    pub liveness: Option<Liveness>,
    /// Where a rewrite puts the interface's primary IPv4 ([`Verdict::Rewritten`]
    /// and [`Verdict::WouldRewrite`]).
    pub rewrite_to: Option<u32>,
    /// A dropped announcement of an IP foreign here: the daemon may hold it
    /// and re-send it unchanged if this node becomes the owner within its
    /// window (the ownership feed lags the announcer at a takeover). Never
    /// for replies (the asker asks again), never in monitor mode (nothing
    /// was dropped).
    pub defer: bool,
}

/// The decision for one announcement of an LB IP: the one place a verdict is
/// made, for the BPF program and every host-side reference.
#[inline(always)]
pub fn judge<S: Surroundings + ?Sized>(
    kind: Kind,
    origin: Origin,
    state: Ownership,
    mode: Mode,
    leak_action: LeakAction,
    s: &mut S,
) -> Judgement {
    let pass = |state, liveness| Judgement {
        verdict: Verdict::Passed,
        state,
        liveness,
        rewrite_to: None,
        defer: false,
    };
    // The owner passes whatever the heartbeat, the interface or the mode
    // say; so does what the guard's daemon sends itself (it judged it).
    if state == Ownership::Owned || origin == Origin::Guard {
        return pass(state, None);
    }
    let live = s.liveness();
    let judged = effective_state(state, live);
    if live == Liveness::Dead {
        return pass(judged, Some(live));
    }
    let stop = match judged {
        Ownership::Owned => false,
        // Defence in depth against a split-brain speaker: stop every origin.
        Ownership::Foreign => true,
        // strictARP's arp_ignore=1 rule for the kernel; a live speaker or
        // datapath responder is the best authority we have, so it passes.
        // The kernel's NDP answers only for addresses on the interface it
        // answers on, or for proxy entries an operator configured (measured:
        // tests/ndp.rs, docs/design.md): no kube-ipvs0 flux to stop.
        Ownership::Unknown => origin == Origin::Kernel && !kind.is_ndp() && !s.ip_on_egress(),
    };
    if !stop {
        return pass(judged, Some(live));
    }
    let rewrite_to = if kind == Kind::AnnounceLeak && leak_action == LeakAction::Rewrite {
        s.egress_primary()
    } else {
        None
    };
    let verdict = match (rewrite_to.is_some(), mode) {
        (false, Mode::Enforce) => Verdict::Dropped,
        (false, Mode::Monitor) => Verdict::WouldDrop,
        (true, Mode::Enforce) => Verdict::Rewritten,
        (true, Mode::Monitor) => Verdict::WouldRewrite,
    };
    Judgement {
        verdict,
        state: judged,
        liveness: Some(live),
        rewrite_to,
        defer: verdict == Verdict::Dropped
            && judged == Ownership::Foreign
            && kind.is_announcement(),
    }
}

/// [`Facts`] answer every question [`judge`] may ask.
impl Surroundings for Facts {
    fn liveness(&mut self) -> Liveness {
        self.liveness
    }
    fn ip_on_egress(&mut self) -> bool {
        self.ip_on_egress
    }
    fn egress_primary(&mut self) -> Option<u32> {
        // Any address will do: the table speaks of whether, not which.
        self.egress_has_ipv4.then_some(1)
    }
}

/// The verdict for a frame whose every fact is known (host references,
/// explanations, the verdict table).
pub fn decide(f: &Facts) -> Verdict {
    let mut facts = *f;
    judge(f.kind, f.origin, f.state, f.mode, f.leak_action, &mut facts).verdict
}

impl Verdict {
    /// The frame leaves the node unchanged.
    #[inline(always)]
    pub fn passes_unchanged(self) -> bool {
        matches!(
            self,
            Verdict::Passed | Verdict::WouldDrop | Verdict::WouldRewrite
        )
    }
}

macro_rules! names {
    ($t:ty { $($v:ident => $s:literal),* $(,)? }) => {
        impl $t {
            pub const ALL: &'static [$t] = &[$(<$t>::$v),*];
            /// The name used in counters, logs and the ownership file.
            pub const fn as_str(self) -> &'static str {
                match self { $(<$t>::$v => $s),* }
            }
            /// The inverse of `as_u8`, for values read back from BPF maps.
            pub fn from_u8(v: u8) -> Option<$t> {
                Self::ALL.iter().copied().find(|x| *x as u8 == v)
            }
        }

        /// In JSON (the API, the CLI) by the same name.
        #[cfg(feature = "serde")]
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        #[cfg(feature = "serde")]
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_str(ByName::<$t>(core::marker::PhantomData))
            }
        }

        #[cfg(feature = "serde")]
        impl Named for $t {
            const WHAT: &'static str = stringify!($t);
            fn all() -> &'static [Self] {
                Self::ALL
            }
            fn name(self) -> &'static str {
                self.as_str()
            }
        }
    };
}

/// The enums that have names, for reading them back by name.
#[cfg(feature = "serde")]
trait Named: Copy + 'static {
    const WHAT: &'static str;
    fn all() -> &'static [Self];
    fn name(self) -> &'static str;
}

#[cfg(feature = "serde")]
struct ByName<T>(core::marker::PhantomData<T>);

#[cfg(feature = "serde")]
impl<T: Named> serde::de::Visitor<'_> for ByName<T> {
    type Value = T;
    fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "a {} name", T::WHAT)
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<T, E> {
        T::all()
            .iter()
            .copied()
            .find(|x| x.name() == v)
            .ok_or_else(|| E::custom(format_args!("unknown {} `{v}`", T::WHAT)))
    }
}
names!(Kind {
    Reply => "reply",
    Gratuitous => "gratuitous",
    AnnounceLeak => "announce_leak",
    NaSolicited => "na_solicited",
    NaUnsolicited => "na_unsolicited",
    NsLeak => "ns_leak",
});
names!(Origin { Kernel => "kernel", Speaker => "speaker", Redirect => "redirect", Guard => "guard" });
names!(Ownership { Owned => "owned", Foreign => "foreign", Unknown => "unknown" });
names!(Mode { Enforce => "enforce", Monitor => "monitor" });
names!(LeakAction { Rewrite => "rewrite", Drop => "drop" });
names!(Liveness { Fresh => "fresh", Stale => "stale", Dead => "dead" });
names!(Verdict {
    Passed => "passed",
    Dropped => "dropped",
    WouldDrop => "would_drop",
    Rewritten => "rewritten",
    WouldRewrite => "would_rewrite",
});

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(kind: Kind, origin: Origin, state: Ownership, on_egress: bool) -> Facts {
        Facts {
            kind,
            origin,
            state,
            ip_on_egress: on_egress,
            egress_has_ipv4: true,
            mode: Mode::Enforce,
            leak_action: LeakAction::Rewrite,
            liveness: Liveness::Fresh,
        }
    }

    /// The whole table, written out by hand from the specification rather than
    /// derived from the code under test.
    #[test]
    fn full_table() {
        use Kind::*;
        use Origin::*;
        use Ownership::*;
        use Verdict::*;
        #[rustfmt::skip]
        let table = [
            // kind, origin, state, on egress iface -> verdict
            (Reply, Kernel, Owned, false, Passed),
            (Reply, Kernel, Owned, true, Passed),
            (Reply, Speaker, Owned, false, Passed),
            (Gratuitous, Kernel, Owned, false, Passed),
            (Gratuitous, Speaker, Owned, true, Passed),
            (AnnounceLeak, Kernel, Owned, false, Passed),
            (AnnounceLeak, Speaker, Owned, false, Passed),
            (Reply, Kernel, Foreign, false, Dropped),
            (Reply, Kernel, Foreign, true, Dropped),
            (Reply, Speaker, Foreign, false, Dropped),
            (Gratuitous, Kernel, Foreign, true, Dropped),
            (Gratuitous, Speaker, Foreign, false, Dropped),
            (AnnounceLeak, Kernel, Foreign, false, Rewritten),
            (AnnounceLeak, Speaker, Foreign, true, Rewritten),
            (Reply, Kernel, Unknown, false, Dropped),
            (Reply, Kernel, Unknown, true, Passed),
            (Reply, Speaker, Unknown, false, Passed),
            (Gratuitous, Kernel, Unknown, false, Dropped),
            (Gratuitous, Kernel, Unknown, true, Passed),
            (Gratuitous, Speaker, Unknown, false, Passed),
            (AnnounceLeak, Kernel, Unknown, false, Rewritten),
            (AnnounceLeak, Kernel, Unknown, true, Passed),
            (AnnounceLeak, Speaker, Unknown, false, Passed),
            // A datapath responder (Cilium) is judged like a speaker.
            (Reply, Redirect, Owned, false, Passed),
            (Reply, Redirect, Foreign, false, Dropped),
            (Reply, Redirect, Foreign, true, Dropped),
            (Reply, Redirect, Unknown, false, Passed),
            (Gratuitous, Redirect, Unknown, false, Passed),
            (Gratuitous, Redirect, Foreign, false, Dropped),
            (AnnounceLeak, Redirect, Unknown, false, Passed),
            (AnnounceLeak, Redirect, Foreign, false, Rewritten),
            // IPv6 NDP: the owner passes, foreign is dropped (never
            // rewritten), unknown passes from every origin (the kernel
            // answers NDP only for its interface's own addresses).
            (NaSolicited, Kernel, Owned, false, Passed),
            (NaUnsolicited, Speaker, Owned, false, Passed),
            (NsLeak, Kernel, Owned, true, Passed),
            (NaSolicited, Kernel, Foreign, true, Dropped),
            (NaSolicited, Speaker, Foreign, false, Dropped),
            (NaUnsolicited, Speaker, Foreign, false, Dropped),
            (NaUnsolicited, Redirect, Foreign, false, Dropped),
            (NsLeak, Kernel, Foreign, true, Dropped),
            (NsLeak, Speaker, Foreign, false, Dropped),
            (NaSolicited, Kernel, Unknown, false, Passed),
            (NaSolicited, Kernel, Unknown, true, Passed),
            (NaUnsolicited, Kernel, Unknown, false, Passed),
            (NaUnsolicited, Speaker, Unknown, false, Passed),
            (NsLeak, Kernel, Unknown, false, Passed),
            (NsLeak, Redirect, Unknown, false, Passed),
            // What the guard's daemon sends itself (held announcements
            // re-sent, refreshes for stale clients) passes in every state.
            (Gratuitous, Guard, Owned, false, Passed),
            (Gratuitous, Guard, Foreign, false, Passed),
            (Reply, Guard, Foreign, false, Passed),
            (Reply, Guard, Unknown, false, Passed),
            (NaSolicited, Guard, Foreign, false, Passed),
            (NaUnsolicited, Guard, Unknown, false, Passed),
        ];
        for (kind, origin, state, on, want) in table {
            assert_eq!(
                decide(&facts(kind, origin, state, on)),
                want,
                "{kind:?} {origin:?} {state:?} on_egress={on}"
            );
        }
    }

    #[test]
    fn every_combination_is_consistent() {
        for &kind in Kind::ALL {
            for &origin in Origin::ALL {
                for &state in Ownership::ALL {
                    for on in [false, true] {
                        for has_v4 in [false, true] {
                            for &leak_action in LeakAction::ALL {
                                let mut f = facts(kind, origin, state, on);
                                f.egress_has_ipv4 = has_v4;
                                f.leak_action = leak_action;
                                let enforce = decide(&f);
                                f.mode = Mode::Monitor;
                                let monitor = decide(&f);
                                // Monitor never changes a frame and mirrors enforce.
                                assert!(monitor.passes_unchanged());
                                let mirrored = match enforce {
                                    Verdict::Passed => Verdict::Passed,
                                    Verdict::Dropped => Verdict::WouldDrop,
                                    Verdict::Rewritten => Verdict::WouldRewrite,
                                    v => panic!("enforce gave {v:?}"),
                                };
                                assert_eq!(monitor, mirrored);
                                // Only announce leaks are ever rewritten, and only with an IPv4 to use.
                                if enforce == Verdict::Rewritten {
                                    assert_eq!(kind, Kind::AnnounceLeak);
                                    assert!(has_v4 && leak_action == LeakAction::Rewrite);
                                }
                                // Owned never stops anything.
                                if state == Ownership::Owned {
                                    assert_eq!(enforce, Verdict::Passed);
                                }
                                // A redirecting responder is judged like a speaker.
                                if origin == Origin::Redirect {
                                    let mut s = f;
                                    s.origin = Origin::Speaker;
                                    assert_eq!(monitor, decide(&s));
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Only an announcement to the segment that was dropped because the IP
    /// is foreign here may be held for a takeover: never a reply, a leak, a
    /// kernel frame of an unknown IP, or anything in monitor mode.
    #[test]
    fn only_dropped_foreign_announcements_are_deferred() {
        for &kind in Kind::ALL {
            for &origin in Origin::ALL {
                for &state in Ownership::ALL {
                    for &mode in [Mode::Enforce, Mode::Monitor].iter() {
                        let mut f = facts(kind, origin, state, false);
                        f.mode = mode;
                        let mut s = f;
                        let j = judge(kind, origin, state, mode, f.leak_action, &mut s);
                        let want = mode == Mode::Enforce
                            && state == Ownership::Foreign
                            && origin != Origin::Guard
                            && matches!(kind, Kind::Gratuitous | Kind::NaUnsolicited);
                        assert_eq!(j.defer, want, "{kind:?} {origin:?} {state:?} {mode:?}");
                        if j.defer {
                            assert_eq!(j.verdict, Verdict::Dropped);
                        }
                    }
                }
            }
        }
        // A stale heartbeat judges foreign as unknown: speakers pass, the
        // kernel's frame is dropped as unknown, and nothing is held.
        let mut f = facts(Kind::Gratuitous, Origin::Kernel, Ownership::Foreign, false);
        f.liveness = Liveness::Stale;
        let mut s = f;
        let j = judge(f.kind, f.origin, f.state, f.mode, f.leak_action, &mut s);
        assert_eq!((j.verdict, j.defer), (Verdict::Dropped, false));
    }

    #[test]
    fn liveness_gate() {
        const S: u64 = 1_000_000_000;
        assert_eq!(liveness(100 * S, 99 * S, 15 * S, 300 * S), Liveness::Fresh);
        assert_eq!(liveness(100 * S, 85 * S, 15 * S, 300 * S), Liveness::Stale);
        assert_eq!(liveness(400 * S, 100 * S, 15 * S, 300 * S), Liveness::Dead);
        assert_eq!(
            liveness(100 * S, 0, 15 * S, 300 * S),
            Liveness::Dead,
            "never written"
        );
        assert_eq!(
            liveness(100 * S, 101 * S, 15 * S, 300 * S),
            Liveness::Fresh,
            "written after now: fresh"
        );
        // Stale: foreign is judged as unknown (kernel stopped, speaker passes).
        let mut f = facts(Kind::Reply, Origin::Speaker, Ownership::Foreign, false);
        f.liveness = Liveness::Stale;
        assert_eq!(decide(&f), Verdict::Passed);
        f.origin = Origin::Kernel;
        assert_eq!(decide(&f), Verdict::Dropped);
        // Dead: everything passes, whatever the state.
        for &state in Ownership::ALL {
            for &origin in Origin::ALL {
                let mut f = facts(Kind::Gratuitous, origin, state, false);
                f.liveness = Liveness::Dead;
                assert_eq!(decide(&f), Verdict::Passed);
            }
        }
    }

    #[test]
    fn leak_without_ipv4_or_with_drop_policy_is_dropped() {
        let mut f = facts(
            Kind::AnnounceLeak,
            Origin::Kernel,
            Ownership::Foreign,
            false,
        );
        f.egress_has_ipv4 = false;
        assert_eq!(decide(&f), Verdict::Dropped);
        f.egress_has_ipv4 = true;
        f.leak_action = LeakAction::Drop;
        assert_eq!(decide(&f), Verdict::Dropped);
    }

    #[test]
    fn classify_kinds() {
        let mk = |op, spa, tpa| ArpFrame {
            op,
            sha: [0; 6],
            spa,
            tpa,
            tha: [0; 6],
            arp_offset: 14,
            vlan_tags: 0,
            vids: [0; crate::frame::MAX_VLAN_TAGS],
        };
        assert_eq!(classify(&mk(2, 10, 1)), Some(Kind::Reply));
        assert_eq!(classify(&mk(2, 10, 10)), Some(Kind::Gratuitous));
        assert_eq!(classify(&mk(1, 10, 10)), Some(Kind::Gratuitous));
        assert_eq!(classify(&mk(1, 10, 1)), Some(Kind::AnnounceLeak));
        assert_eq!(classify(&mk(3, 10, 1)), None);
    }

    #[test]
    fn names_round_trip() {
        for &v in Verdict::ALL {
            assert_eq!(Verdict::from_u8(v as u8), Some(v));
        }
        assert_eq!(Kind::AnnounceLeak.as_str(), "announce_leak");
        assert_eq!(Ownership::from_u8(9), None);
    }
}
