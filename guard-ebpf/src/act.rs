//! The one path of every claim, ARP or NDP: the shared decision
//! (`guard_common::judge`) asked with what the maps and the skb say,
//! applied to the frame, counted, reported, and (a foreign IP's dropped
//! announcement) held for the daemon.

use aya_ebpf::programs::TcContext;
use guard_common::{
    frame::VID_MASK, liveness, Config, CounterKey, HeldFrame, IfAddrKey, LeakAction, Liveness,
    Mode, Origin, Ownership, Stat, Surroundings, Verdict, VlanKey, GUARD_MARK, HELD_FRAME_MAX,
};

use crate::{
    claim::OutgoingClaim,
    maps::{CONFIG, HEARTBEAT, HELD, IF_ADDRS, IF_PRIMARY, VLAN_UPPERS},
    report::{bump, count, emit, log_counter_map_full, report_announcement},
    skb::{DROP, PASS},
};

/// AF_PACKET: the family of the socket a userspace speaker writes through.
const AF_PACKET: u32 = 17;
/// AF_INET6: the kernel's own NDP goes out with its per-namespace ndisc
/// socket, bound to nothing; an NDP speaker (mdlayher/ndp, used by MetalLB
/// and kube-vip) writes through a raw ICMPv6 socket bound to the interface.
const AF_INET6: u32 = 10;

/// Judge `c` with the shared decision, apply it, count it and tell the
/// operator: the same for ARP and NDP.
#[inline(always)]
pub(crate) fn act(ctx: &TcContext, c: &OutgoingClaim) -> i32 {
    // SAFETY: a live element of an LB map (a lookup's result). The daemon
    // replaces values whole; the program only ever clears `watch`.
    let state = Ownership::from_u8(unsafe { (*c.entry).state }).unwrap_or(Ownership::Unknown);
    // By reference: copying the 40-byte value cost more than the lookup.
    let Some(config) = CONFIG.get(0) else {
        return PASS;
    };
    let mode = if config.mode == Mode::Monitor as u8 {
        Mode::Monitor
    } else {
        Mode::Enforce
    };
    let leak_action = if config.leak_action == LeakAction::Drop as u8 {
        LeakAction::Drop
    } else {
        LeakAction::Rewrite
    };
    let origin = origin(ctx);
    let mut env = Env {
        ctx,
        vlan_tags: c.vlan_tags,
        vids: c.vids,
        lb_ipv4: c.lb_ipv4,
        // SAFETY: ctx.skb.skb is the kernel's __sk_buff for this invocation.
        ifindex: unsafe { (*ctx.skb.skb).ifindex },
        device: 0,
        config,
        now: 0,
    };
    let kind = c.kind;
    let j = guard_common::judge(kind, origin, state, mode, leak_action, &mut env);
    let mut verdict = j.verdict;
    if verdict == Verdict::Rewritten {
        let addr = j.rewrite_to.unwrap_or(0).to_be_bytes();
        if env.ctx.store(c.rewrite_at, &addr, 0).is_err() {
            bump(Stat::RewriteFailed);
            verdict = Verdict::Dropped;
        }
    }
    let first_full = count(
        ctx,
        CounterKey {
            ip: c.ip,
            ifindex: env.ifindex,
            kind: kind as u8,
            origin: origin as u8,
            state: j.state as u8,
            verdict: verdict as u8,
        },
    );
    if verdict != Verdict::Passed {
        emit(c, env.ifindex, origin, j.state, verdict, env.now, config);
    }
    if j.defer && config.defer != 0 {
        defer(ctx, c, origin, env.now, env.ifindex);
    }
    if verdict == Verdict::Passed && kind.is_announcement() {
        report_announcement(c, env.ifindex, origin, j.state);
    }
    let action = if verdict == Verdict::Dropped {
        DROP
    } else {
        PASS
    };
    if first_full {
        log_counter_map_full(ctx);
    }
    action
}

/// What `guard_common::judge` may ask, answered from the maps and the clock
/// on first use only.
struct Env<'a> {
    ctx: &'a TcContext,
    /// The frame's VLAN tags in its data, and their IDs.
    vlan_tags: u8,
    vids: [u16; 2],
    /// The LB IP when it is IPv4 (host order), for the egress-address rule,
    /// which only ARP asks about; 0 for NDP.
    lb_ipv4: u32,
    ifindex: u32,
    /// The device whose addresses the frame is judged against: the VLAN
    /// device its tags lead to, else `ifindex`. 0 until first asked.
    device: u32,
    config: &'a Config,
    now: u64,
}

impl Env<'_> {
    /// The VLAN device the frame was sent from, when it carries tags and
    /// the daemon knows a VLAN device for them on this interface (at most
    /// two levels); else the uplink itself. Tags, outermost
    /// first: the one in skb metadata (a VLAN device over a device that
    /// offloads tagging), then those in the data.
    #[inline(always)]
    fn device(&mut self) -> u32 {
        if self.device != 0 {
            return self.device;
        }
        let skb = self.ctx.skb.skb;
        // SAFETY: ctx.skb.skb is the kernel's __sk_buff for this invocation.
        let (meta, tci) = unsafe { ((*skb).vlan_present != 0, (*skb).vlan_tci) };
        let (tags, vids) = (self.vlan_tags, self.vids);
        let (first, second) = if meta {
            (Some((tci as u16) & VID_MASK), (tags > 0).then_some(vids[0]))
        } else {
            ((tags > 0).then_some(vids[0]), (tags > 1).then_some(vids[1]))
        };
        let mut dev = self.ifindex;
        if let Some(vid) = first {
            if let Some(upper) = vlan_upper(dev, vid) {
                dev = upper;
                if let Some(upper) = second.and_then(|vid| vlan_upper(dev, vid)) {
                    dev = upper;
                }
            }
        }
        self.device = dev;
        dev
    }
}

#[inline(always)]
fn vlan_upper(lower: u32, vid: u16) -> Option<u32> {
    let key = VlanKey {
        lower,
        vid: u32::from(vid),
    };
    // SAFETY: a plain lookup of a Copy value.
    unsafe { VLAN_UPPERS.get(&key) }.copied()
}

impl Surroundings for Env<'_> {
    #[inline(always)]
    fn liveness(&mut self) -> Liveness {
        // SAFETY: bpf_ktime_get_ns has no preconditions.
        self.now = unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() };
        let heartbeat = HEARTBEAT.get(0).copied().unwrap_or(0);
        let live = liveness(
            self.now,
            heartbeat,
            self.config.stale_after_ns,
            self.config.dead_after_ns,
        );
        match live {
            Liveness::Fresh => {}
            Liveness::Stale => {
                bump(Stat::HeartbeatStale);
            }
            Liveness::Dead => {
                bump(Stat::HeartbeatDeadPassed);
            }
        }
        live
    }

    #[inline(always)]
    fn ip_on_egress(&mut self) -> bool {
        let key = IfAddrKey {
            ifindex: self.device(),
            addr: self.lb_ipv4,
        };
        // SAFETY: a plain lookup of a Copy value.
        unsafe { IF_ADDRS.get(&key) }.is_some()
    }

    #[inline(always)]
    fn egress_primary(&mut self) -> Option<u32> {
        let device = self.device();
        // SAFETY: a plain lookup of a Copy value.
        unsafe { IF_PRIMARY.get(&device) }.copied()
    }
}

/// Copy a dropped announcement of a foreign IP, whole, to the daemon
/// (`HELD`), which re-sends it if this node becomes the owner within its
/// window. What cannot be copied is counted: it is dropped all the same (a
/// split-brain speaker must not get through by filling the ring).
#[inline(always)]
fn defer(ctx: &TcContext, c: &OutgoingClaim, origin: Origin, now: u64, ifindex: u32) {
    let len = ctx.len();
    if len > HELD_FRAME_MAX as u32 {
        bump(Stat::AnnounceDeferFailed);
        return;
    }
    // Two checks with different outcomes, so that the compiler keeps them
    // apart: a kernel before 6.8 learns the size's lower bound only from
    // a comparison on the size's own register (it may not be 0), not from
    // one range check on `len - 42`. Nothing this short was parsed as an
    // announcement (ARP needs 42 bytes).
    if len < guard_common::frame::ETH_HLEN as u32 + 28 {
        return;
    }
    let Some(mut held) = HELD.reserve::<HeldFrame>(0) else {
        bump(Stat::AnnounceDeferFailed);
        return;
    };
    let p = held.as_mut_ptr();
    // SAFETY: `p` points at a reserved ring buffer record of HeldFrame's
    // size, ours until submitted or discarded; ctx.skb.skb is the kernel's
    // __sk_buff for this invocation; `len` is within 42..=HELD_FRAME_MAX,
    // the size of `data`.
    let copied = unsafe {
        let skb = ctx.skb.skb;
        (*p).ip = c.ip;
        (*p).at_ns = now;
        (*p).ifindex = ifindex;
        let tagged = (*skb).vlan_present != 0;
        (*p).vlan_tci = if tagged { (*skb).vlan_tci as u16 } else { 0 };
        (*p).vlan_proto = if tagged { (*skb).vlan_proto as u16 } else { 0 };
        (*p).len = len as u16;
        (*p).kind = c.kind as u8;
        (*p).origin = origin as u8;
        (*p)._pad = [0; 4];
        aya_ebpf::helpers::bpf_skb_load_bytes(
            skb as *const _,
            0,
            (*p).data.as_mut_ptr() as *mut _,
            len,
        ) == 0
    };
    if copied {
        held.submit(0);
        bump(Stat::AnnounceDeferred);
    } else {
        held.discard(0);
        bump(Stat::AnnounceDeferFailed);
    }
}

/// Kernel ARP (replies, neighbour solicitations, address notifications) has
/// no socket and no ingress device; a userspace speaker writes through an
/// AF_PACKET socket; a frame another program redirected out of the device it
/// came in on (Cilium's ARP responder turns the request into a reply at TC
/// ingress) has no socket of this node and keeps that device as its
/// `ingress_ifindex`. A frame forwarded from another device (a bridge port)
/// is not a responder gating itself: it is judged as the kernel's. The
/// guard's own daemon writes through an AF_PACKET socket with
/// [`GUARD_MARK`] (setting a mark needs CAP_NET_ADMIN). NDP: the
/// kernel's carries its unbound ndisc socket; a raw ICMPv6 socket bound to a
/// device is a speaker's (an unbound one reads as the kernel's: for NDP the
/// verdict does not depend on the origin, only its label does).
#[inline(always)]
fn origin(ctx: &TcContext) -> Origin {
    // SAFETY: reading skb->sk, mark, ingress_ifindex and ifindex is allowed
    // for TC programs; the verifier types sk as a nullable socket pointer
    // and we check for null before use.
    unsafe {
        let skb = ctx.skb.skb;
        let sk = (*skb).__bindgen_anon_2.sk;
        if !sk.is_null() && (*sk).family == AF_PACKET && (*skb).mark == GUARD_MARK {
            Origin::Guard
        } else if !sk.is_null()
            && ((*sk).family == AF_PACKET || ((*sk).family == AF_INET6 && (*sk).bound_dev_if != 0))
        {
            Origin::Speaker
        } else if (*skb).ingress_ifindex != 0 && (*skb).ingress_ifindex == (*skb).ifindex {
            Origin::Redirect
        } else {
            Origin::Kernel
        }
    }
}
