use aya_ebpf::{
    bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC},
    macros::{classifier, map},
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::TcContext,
};
use aya_log_ebpf::error;
use guard_common::{
    frame::{ETH_HLEN, VID_MASK},
    liveness,
    ndp::{may_be_ndp, ETH_P_IPV6},
    parse, take_token, v4_key,
    verdict::classify,
    Config, CounterKey, CounterValue, DropEvent, FrameReader, HeldFrame, IfAddrKey, IpKey, Kind,
    LbEntry, LeakAction, Liveness, Mode, Origin, Ownership, Parsed, RateLimit, Stat, Surroundings,
    Verdict, VlanKey, GUARD_MARK, HELD_FRAME_MAX, HELD_RING_BYTES, LB_FILTER_WORDS, MAX_COUNTERS,
    MAX_IF_ADDRS, MAX_LB_IPS,
};

/// Linux's BPF_F_NO_PREALLOC: the counter map grows with use instead of
/// reserving MAX_COUNTERS x CPUs entries up front.
const BPF_F_NO_PREALLOC: u32 = 1;
/// AF_PACKET: the family of the socket a userspace speaker writes through.
const AF_PACKET: u32 = 17;
/// AF_INET6: the kernel's own NDP goes out with its per-namespace ndisc
/// socket, bound to nothing; an NDP speaker (mdlayher/ndp, used by MetalLB
/// and kube-vip) writes through a raw ICMPv6 socket bound to the interface.
const AF_INET6: u32 = 10;

#[map(name = "LB_IPS")]
pub(crate) static LB_IPS: HashMap<u32, LbEntry> = HashMap::with_max_entries(MAX_LB_IPS, 0);

/// Allocated on use: most clusters have few IPv6 LB IPs, if any.
#[map(name = "LB_IPS6")]
pub(crate) static LB_IPS6: HashMap<IpKey, LbEntry> =
    HashMap::with_max_entries(MAX_LB_IPS, BPF_F_NO_PREALLOC);

#[map(name = "LB_FILTER")]
static LB_FILTER: Array<u64> = Array::with_max_entries(LB_FILTER_WORDS, 0);

#[map(name = "IF_ADDRS")]
static IF_ADDRS: HashMap<IfAddrKey, u8> = HashMap::with_max_entries(MAX_IF_ADDRS, 0);

#[map(name = "IF_PRIMARY")]
static IF_PRIMARY: HashMap<u32, u32> = HashMap::with_max_entries(MAX_IF_ADDRS, 0);

#[map(name = "VLAN_UPPERS")]
static VLAN_UPPERS: HashMap<VlanKey, u32> = HashMap::with_max_entries(MAX_IF_ADDRS, 0);

#[map(name = "COUNTERS")]
static COUNTERS: PerCpuHashMap<CounterKey, CounterValue> =
    PerCpuHashMap::with_max_entries(MAX_COUNTERS, BPF_F_NO_PREALLOC);

#[map(name = "STATS")]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Stat::COUNT, 0);

#[map(name = "CONFIG")]
pub(crate) static CONFIG: Array<Config> = Array::with_max_entries(1, 0);

#[map(name = "HEARTBEAT")]
static HEARTBEAT: Array<u64> = Array::with_max_entries(1, 0);

#[map(name = "EVENTS")]
static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

#[map(name = "EVENT_RATE")]
static EVENT_RATE: PerCpuArray<RateLimit> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "HELD")]
static HELD: RingBuf = RingBuf::with_byte_size(HELD_RING_BYTES, 0);

/// "No opinion": lets later programs in the TCX chain (or later cls_bpf
/// filters) run, and passes the frame at the end of the chain.
pub(crate) const PASS: i32 = TC_ACT_UNSPEC;
const DROP: i32 = TC_ACT_SHOT as i32;

pub(crate) struct Skb<'a>(pub(crate) &'a TcContext);

impl FrameReader for Skb<'_> {
    /// Straight from the linear data when the bytes are there (no helper
    /// call: a bounds check the verifier also sees); through
    /// `bpf_skb_load_bytes` when they are not (a frame in paged fragments).
    /// Benchmarks: a helper call here cost about 25 ns per read.
    #[inline(always)]
    fn read<const N: usize>(&self, offset: usize) -> Option<[u8; N]> {
        let (data, end) = (self.0.data(), self.0.data_end());
        if data + offset + N <= end {
            // SAFETY: bounds checked just above; the verifier sees the same check.
            return Some(unsafe { core::ptr::read_unaligned((data + offset) as *const [u8; N]) });
        }
        self.0.load::<[u8; N]>(offset).ok()
    }
}

#[classifier]
pub fn arp_guard_egress(ctx: TcContext) -> i32 {
    bump(Stat::Frames);
    let ethertype = match outer_ethertype(&ctx) {
        Some(t) => t,
        None => return PASS,
    };
    if !worth_parsing(&ctx, ethertype) {
        return PASS;
    }
    let arp = match parse(&Skb(&ctx), ethertype) {
        Parsed::Other => return PASS,
        Parsed::Malformed => {
            bump(Stat::Arp);
            bump(Stat::Malformed);
            return PASS;
        }
        Parsed::NdMalformed => {
            bump(Stat::Ndp);
            bump(Stat::NdpMalformed);
            return PASS;
        }
        Parsed::Ipv6Unfollowed => {
            bump(Stat::Ipv6Unfollowed);
            return PASS;
        }
        Parsed::Nd(nd) => {
            bump(Stat::Ndp);
            return crate::ndp::judge(&ctx, &nd);
        }
        Parsed::Arp(arp) => arp,
    };
    bump(Stat::Arp);
    // A tag in metadata leaves the data untagged: the frame is judged exactly
    // like an untagged one; we only count that it happened.
    // SAFETY: ctx.skb.skb is the kernel's __sk_buff for this invocation.
    if unsafe { (*ctx.skb.skb).vlan_present } != 0 {
        bump(Stat::VlanInMetadata);
    }
    judge(&ctx, &arp)
}

/// The fast path of both programs: anything that is neither ARP, VLAN-tagged,
/// nor IPv6 that may be NDP (ICMPv6 or an extension header first) is not
/// parsed at all.
#[inline(always)]
pub(crate) fn worth_parsing(ctx: &TcContext, ethertype: u16) -> bool {
    if ethertype == ETH_P_IPV6 {
        ipv6_next_header(ctx).is_some_and(may_be_ndp)
    } else {
        ethertype == guard_common::frame::ETH_P_ARP || guard_common::frame::is_vlan(ethertype)
    }
}

/// The next-header byte of an untagged IPv6 packet, from the linear data.
#[inline(always)]
fn ipv6_next_header(ctx: &TcContext) -> Option<u8> {
    // Next header and hop limit: two bytes, as a one-byte read compiles to
    // a bounds check the verifier cannot use.
    Skb(ctx).read::<2>(ETH_HLEN + 6).map(|b| b[0])
}

/// What `guard_common::judge` may ask, answered from the maps and the clock
/// on first use only.
pub(crate) struct Env<'a> {
    pub(crate) ctx: &'a TcContext,
    /// The frame's VLAN tags in its data, and their IDs.
    pub(crate) vlan_tags: u8,
    pub(crate) vids: [u16; 2],
    /// The IPv4 LB IP of an ARP frame (for the egress-address rule); 0 for NDP.
    pub(crate) spa: u32,
    pub(crate) ifindex: u32,
    /// The device whose addresses the frame is judged against: the VLAN
    /// device its tags lead to, else `ifindex`. 0 until first asked.
    pub(crate) device: u32,
    pub(crate) config: &'a Config,
    pub(crate) now: u64,
}

impl Env<'_> {
    /// The VLAN device the frame was sent from, when it carries tags and
    /// the daemon knows a VLAN device for them on this interface (at most
    /// two levels); else the guarded interface itself. Tags, outermost
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
                bump(Stat::GateStale);
            }
            Liveness::Dead => {
                bump(Stat::GateOpen);
            }
        }
        live
    }

    #[inline(always)]
    fn ip_on_egress(&mut self) -> bool {
        let key = IfAddrKey {
            ifindex: self.device(),
            addr: self.spa,
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

/// Whether `ip` may be an LB IP: a clear bit in LB_FILTER proves it is
/// not, with an array read the verifier inlines (no call, unlike the hash
/// lookup it spares ARP from node addresses). Fails open to the lookup.
#[inline(always)]
pub(crate) fn may_be_lb(ip: u32) -> bool {
    let (word, bit) = guard_common::lb_filter_slot(ip);
    LB_FILTER.get(word).is_none_or(|w| *w & bit != 0)
}

#[inline(always)]
fn judge(ctx: &TcContext, arp: &guard_common::ArpFrame) -> i32 {
    if !may_be_lb(arp.spa) {
        bump(Stat::NotLb);
        return PASS;
    }
    let Some(entry) = LB_IPS.get_ptr_mut(&arp.spa) else {
        bump(Stat::NotLb);
        return PASS;
    };
    let Some(kind) = classify(arp) else {
        return PASS;
    };
    let claim = Claim {
        ip: v4_key(arp.spa),
        kind,
        entry,
        requester_ip: v4_key(arp.tpa),
        requester_mac: arp.tha,
        spa: arp.spa,
        rewrite_at: arp.spa_offset(),
        vlan_tags: arp.vlan_tags,
        vids: arp.vids,
    };
    act(ctx, &claim)
}

/// An announcement of an LB IP, of either family, ready to be judged.
pub(crate) struct Claim {
    pub(crate) ip: IpKey,
    pub(crate) kind: Kind,
    /// The IP's entry in its LB map (non-null: a lookup's result); its
    /// state is read, its watch flag cleared once reported.
    pub(crate) entry: *mut LbEntry,
    pub(crate) requester_ip: IpKey,
    pub(crate) requester_mac: [u8; 6],
    /// IPv4: the LB IP, host order (0 for NDP, which never asks).
    pub(crate) spa: u32,
    /// Where an announce leak's rewrite writes (ARP SPA).
    pub(crate) rewrite_at: usize,
    pub(crate) vlan_tags: u8,
    pub(crate) vids: [u16; 2],
}

/// Judge `c` with the shared decision, apply it, count it and tell the
/// operator: the same for ARP and NDP.
#[inline(always)]
pub(crate) fn act(ctx: &TcContext, c: &Claim) -> i32 {
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
        spa: c.spa,
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
    count(
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
    if verdict == Verdict::Dropped {
        DROP
    } else {
        PASS
    }
}

/// An announcement passed for an IP whose entry asked to hear of the next
/// one (the daemon sets `watch` when an IP's state changes to owned or
/// unknown): one event, outside the drop events' rate limit (one per
/// change of state), and the flag cleared. Two CPUs may both report it;
/// the daemon keeps the first.
#[inline(always)]
fn report_announcement(c: &Claim, ifindex: u32, origin: Origin, state: Ownership) {
    // SAFETY: a live element of an LB map; see `act`.
    unsafe {
        if (*c.entry).watch == 0 {
            return;
        }
        (*c.entry).watch = 0;
    }
    let event = DropEvent {
        lb_ip: c.ip,
        requester_ip: c.requester_ip,
        ifindex,
        requester_mac: c.requester_mac,
        kind: c.kind as u8,
        origin: origin as u8,
        state: state as u8,
        verdict: Verdict::Passed as u8,
        _pad: [0; 2],
        // SAFETY: bpf_ktime_get_ns has no preconditions.
        at_ns: unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() },
    };
    if EVENTS.output::<DropEvent>(&event, 0).is_ok() {
        bump(Stat::EventsDelivered);
    } else {
        bump(Stat::EventsSuppressed);
    }
}

/// Copy a dropped announcement of a foreign IP, whole, to the daemon
/// (`HELD`), which re-sends it if this node becomes the owner within its
/// window. What cannot be copied is counted: it is dropped all the same (a
/// split-brain speaker must not get through by filling the ring).
#[inline(always)]
fn defer(ctx: &TcContext, c: &Claim, origin: Origin, now: u64, ifindex: u32) {
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

/// One event for the operator, within the per-CPU rate limit: a storm of
/// frames cannot flood userspace; what is held back is counted. The event
/// is built only once a token allows it.
#[inline(always)]
fn emit(
    c: &Claim,
    ifindex: u32,
    origin: Origin,
    state: Ownership,
    verdict: Verdict,
    now: u64,
    config: &Config,
) {
    let Some(bucket) = EVENT_RATE.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot of a per-CPU array.
    let allowed = take_token(
        unsafe { &mut *bucket },
        now,
        config.events_per_sec,
        config.events_burst,
    );
    if !allowed {
        bump(Stat::EventsSuppressed);
        return;
    }
    let event = DropEvent {
        lb_ip: c.ip,
        requester_ip: c.requester_ip,
        ifindex,
        requester_mac: c.requester_mac,
        kind: c.kind as u8,
        origin: origin as u8,
        state: state as u8,
        verdict: verdict as u8,
        _pad: [0; 2],
        at_ns: now,
    };
    if EVENTS.output::<DropEvent>(&event, 0).is_ok() {
        bump(Stat::EventsDelivered);
    } else {
        bump(Stat::EventsSuppressed);
    }
}

/// The outer ethertype, read straight from the linear data when it is there.
#[inline(always)]
pub(crate) fn outer_ethertype(ctx: &TcContext) -> Option<u16> {
    let (data, end) = (ctx.data(), ctx.data_end());
    if data + ETH_HLEN <= end {
        // SAFETY: bounds checked just above; the verifier sees the same check.
        let b = unsafe { core::ptr::read_unaligned((data + 12) as *const [u8; 2]) };
        return Some(u16::from_be_bytes(b));
    }
    ctx.load::<[u8; 2]>(12).ok().map(u16::from_be_bytes)
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

#[inline(always)]
fn count(ctx: &TcContext, key: CounterKey) {
    let bytes = u64::from(ctx.len());
    if let Some(v) = COUNTERS.get_ptr_mut(&key) {
        // SAFETY: per-CPU value, only this CPU writes it while we run.
        unsafe {
            (*v).packets += 1;
            (*v).bytes += bytes;
        }
        return;
    }
    let fresh = CounterValue { packets: 1, bytes };
    // Two CPUs may insert the same new key at once; each insert writes only
    // its own CPU's slot (the others are zeroed), so no count is lost.
    if COUNTERS.insert(&key, &fresh, 0).is_err() && bump(Stat::CounterFull) == 1 {
        // Once per CPU: the STATS counter keeps the tally, this only points at it.
        error!(ctx, "arp-guard: counter map full; decisions are no longer counted per LB IP (see STATS counter_map_full)");
    }
}

/// Add one to a per-CPU total; returns the new value on this CPU.
#[inline(always)]
pub(crate) fn bump(stat: Stat) -> u64 {
    match STATS.get_ptr_mut(stat as u32) {
        // SAFETY: this CPU's slot of a per-CPU array; nothing else writes it now.
        Some(v) => unsafe {
            *v += 1;
            *v
        },
        None => 0,
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// The licence declared to the kernel. The kernel lets only programs with a
/// GPL-compatible licence use some helpers and run in its GPL context;
/// "Dual MIT/GPL" is one it accepts, and MIT is how these sources are
/// licensed (MIT OR Apache-2.0, as the whole project), so the declaration
/// asks nothing more of a user than the project's own licence does.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
