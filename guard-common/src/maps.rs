//! The BPF maps shared between the program and userspace: one map per job,
//! `#[repr(C)]` keys and values with explicit padding.

/// LB IP (host-order u32) -> [`LbEntry`]. The LB set and this node's view of
/// each IP's owner. An IP absent from this map is not an LB IP.
pub const MAP_LB_IPS: &str = "LB_IPS";
/// IPv6 LB IP (16 bytes, network order) -> [`LbEntry`]: the IPv6 LB set,
/// judged for Neighbor Discovery. Allocated on use (few IPv6 LB IPs on most
/// clusters); same capacity as [`MAP_LB_IPS`].
pub const MAP_LB_IPS6: &str = "LB_IPS6";
/// Array of [`LB_FILTER_WORDS`] u64: one bit per hash of an IP, set for every
/// IP in [`MAP_LB_IPS`] ([`lb_filter_slot`]). A clear bit proves "not an LB
/// IP" with one inlined array read, so ARP from node addresses skips the hash
/// lookup; a set bit only sends the frame on to `LB_IPS`. Written by the
/// daemon before an IP enters `LB_IPS` and after it leaves.
pub const MAP_LB_FILTER: &str = "LB_FILTER";
/// 2^20 bits (128 KiB): about 6% of bits set at 65,536 LB IPs.
pub const LB_FILTER_WORDS: u32 = 16_384;

/// The word of [`MAP_LB_FILTER`] and the bit in it that stand for `ip`
/// (host order): a multiplicative hash, so that the addresses of one pool,
/// which differ in their low bits, spread over the table.
#[inline(always)]
pub fn lb_filter_slot(ip: u32) -> (u32, u64) {
    let h = ip.wrapping_mul(0x9E37_79B1) >> 12;
    (h >> 6, 1u64 << (h & 63))
}

/// [`IfAddrKey`] -> u8 (1). IPv4 addresses configured on uplinks,
/// for the "LB IP is on the egress interface" (arp_ignore=1) rule.
pub const MAP_IF_ADDRS: &str = "IF_ADDRS";
/// ifindex -> primary IPv4 (host-order u32), used to rewrite announce leaks.
pub const MAP_IF_PRIMARY: &str = "IF_PRIMARY";
/// [`VlanKey`] -> the VLAN device's ifindex, for the VLAN devices stacked on
/// an uplink (two levels: QinQ). A frame that leaves the uplink with a
/// tag (in skb metadata or in its data) is judged against
/// the addresses and primary of the VLAN device it came from, as the kernel
/// answered on that device; with no entry, against the uplink.
pub const MAP_VLAN_UPPERS: &str = "VLAN_UPPERS";
/// Per-CPU [`CounterKey`] -> [`CounterValue`]: one counter per decision.
pub const MAP_COUNTERS: &str = "COUNTERS";
/// Per-CPU array of u64 indexed by [`Stat`]: totals that have no LB IP.
pub const MAP_STATS: &str = "STATS";
/// Array with one [`Config`] at index 0.
pub const MAP_CONFIG: &str = "CONFIG";
/// Array with one u64 at index 0: the daemon's last heartbeat, CLOCK_MONOTONIC ns.
pub const MAP_HEARTBEAT: &str = "HEARTBEAT";
/// Ring buffer of [`DropEvent`]s: one per decision that dropped, would drop or
/// rewrote a frame, rate-limited in the kernel.
pub const MAP_EVENTS: &str = "EVENTS";
/// Per-CPU [`RateLimit`] state of the event token bucket.
pub const MAP_EVENT_RATE: &str = "EVENT_RATE";
/// Ring buffer of [`HeldFrame`]s: announcements of LB IPs foreign here that
/// the program dropped, copied whole for the daemon, which re-sends them if
/// this node becomes the owner within its window (`--announce-hold`).
pub const MAP_HELD: &str = "HELD";
/// Its size: about 880 frames, a node taking over hundreds of IPs at once
/// (two gratuitous ARPs each) before the daemon has read one.
pub const HELD_RING_BYTES: u32 = 256 * 1024;
/// The longest frame held (an ARP frame is 42 bytes with no tag, 50 with
/// two; an NA with a link-layer option 86, more with extension headers).
/// A longer announcement is dropped and counted ([`Stat::AnnounceDeferFailed`]).
pub const HELD_FRAME_MAX: usize = 256;

/// An IP address as the counters and events carry it: 16 bytes in network
/// order, an IPv4 address as IPv4-mapped IPv6 (`::ffff:a.b.c.d`, RFC 4291
/// 2.5.5.2), so one key serves both families.
pub type IpKey = [u8; 16];

/// `ip` (host order) as an [`IpKey`].
#[inline(always)]
pub fn v4_key(ip: u32) -> IpKey {
    let b = ip.to_be_bytes();
    [
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, b[0], b[1], b[2], b[3],
    ]
}

/// `ip` as an [`IpKey`].
pub fn key_of_ip(ip: core::net::IpAddr) -> IpKey {
    match ip {
        core::net::IpAddr::V4(v4) => v4_key(u32::from(v4)),
        core::net::IpAddr::V6(v6) => v6.octets(),
    }
}

/// The address an [`IpKey`] stands for (IPv4-mapped: the IPv4 address).
pub fn ip_of_key(k: IpKey) -> core::net::IpAddr {
    let v6 = core::net::Ipv6Addr::from(k);
    match v6.to_ipv4_mapped() {
        Some(v4) => core::net::IpAddr::V4(v4),
        None => core::net::IpAddr::V6(v6),
    }
}

/// The `family` label of an address: "ipv4" or "ipv6".
pub fn family(ip: &core::net::IpAddr) -> &'static str {
    if ip.is_ipv4() {
        "ipv4"
    } else {
        "ipv6"
    }
}

/// One drop / would-drop / rewrite decision, for the operator's event
/// stream; with [`crate::Verdict::Passed`], the first announcement that left
/// for an LB IP whose entry asked for it ([`LbEntry::watch`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DropEvent {
    /// The LB IP announced (ARP SPA; an NA's target, an NS's source).
    pub lb_ip: IpKey,
    /// The neighbour the frame was for (ARP TPA; the IPv6 destination).
    pub requester_ip: IpKey,
    pub ifindex: u32,
    /// The requester's MAC (ARP THA: zero or broadcast for gratuitous ARP;
    /// NDP: the Ethernet destination).
    pub requester_mac: [u8; 6],
    /// [`crate::Kind`], [`crate::Origin`], [`crate::Ownership`] (as judged), [`crate::Verdict`].
    pub kind: u8,
    pub origin: u8,
    pub state: u8,
    pub verdict: u8,
    pub _pad: [u8; 2],
    /// When the program decided (CLOCK_MONOTONIC ns).
    pub at_ns: u64,
}

/// Token bucket for [`DropEvent`]s, per CPU.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RateLimit {
    /// Tokens, in millionths of an event.
    pub tokens_micro: u64,
    pub last_ns: u64,
}

/// Refill `bucket` for the time since its last use and take one token if it
/// has one: the in-kernel rate limit of the event stream, `rate` events per
/// second per CPU with bursts of `burst`.
#[inline(always)]
pub fn take_token(bucket: &mut RateLimit, now_ns: u64, rate: u32, burst: u32) -> bool {
    const MICRO: u64 = 1_000_000;
    let cap = u64::from(burst) * MICRO;
    let elapsed = now_ns.saturating_sub(bucket.last_ns);
    // rate events/s = rate * MICRO micro-events per 1e9 ns; cap elapsed first
    // so the product cannot overflow.
    let refill = elapsed.min(10_000_000_000) * u64::from(rate) / 1_000;
    bucket.tokens_micro = (bucket.tokens_micro + refill).min(cap);
    bucket.last_ns = now_ns;
    if bucket.tokens_micro >= MICRO {
        bucket.tokens_micro -= MICRO;
        true
    } else {
        false
    }
}

/// Capacity of [`MAP_LB_IPS`].
pub const MAX_LB_IPS: u32 = 65_536;
/// Capacity of the address maps.
pub const MAX_IF_ADDRS: u32 = 4_096;
/// Capacity of [`MAP_COUNTERS`]. Allocated on demand (BPF_F_NO_PREALLOC).
pub const MAX_COUNTERS: u32 = 65_536;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct LbEntry {
    /// [`crate::Ownership`] as u8.
    pub state: u8,
    /// 1: report the next announcement of this IP that passes (an event
    /// with verdict `passed`), then clear this. The daemon sets it with
    /// every write of an entry that is not `foreign` (writes happen when
    /// the state changes), so that it learns when a new owner's first
    /// announcement left (or a moving IP's, while it is unknown); the
    /// program clears it. Not part of the entry's value: equality ignores
    /// it, so the program's clearing is no drift to repair.
    pub watch: u8,
    pub _pad: [u8; 2],
}

impl LbEntry {
    pub const fn new(state: crate::Ownership) -> Self {
        LbEntry {
            state: state as u8,
            watch: !matches!(state, crate::Ownership::Foreign) as u8,
            _pad: [0; 2],
        }
    }
}

impl PartialEq for LbEntry {
    fn eq(&self, other: &Self) -> bool {
        self.state == other.state
    }
}
impl Eq for LbEntry {}

/// An announcement the program dropped for an IP foreign here, whole, for
/// the daemon to re-send if this node becomes its owner soon
/// ([`MAP_HELD`]).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HeldFrame {
    /// The LB IP announced ([`IpKey`]).
    pub ip: IpKey,
    /// When it was dropped (CLOCK_MONOTONIC ns).
    pub at_ns: u64,
    /// The interface it was leaving by.
    pub ifindex: u32,
    /// The VLAN tag the frame carried in skb metadata (a VLAN device above
    /// an interface that offloads tagging), to be put back into the bytes.
    pub vlan_tci: u16,
    /// Its protocol (0x8100 or 0x88a8, big-endian as read), 0: none.
    pub vlan_proto: u16,
    /// Bytes of `data` that are the frame.
    pub len: u16,
    /// [`crate::Kind`] and [`crate::Origin`] as u8.
    pub kind: u8,
    pub origin: u8,
    pub _pad: [u8; 4],
    pub data: [u8; HELD_FRAME_MAX],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IfAddrKey {
    pub ifindex: u32,
    pub addr: u32,
}

/// (lower device's ifindex, VLAN ID) of a VLAN device.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VlanKey {
    pub lower: u32,
    pub vid: u32,
}

impl IfAddrKey {
    pub fn new(ifindex: u32, addr: core::net::Ipv4Addr) -> Self {
        IfAddrKey {
            ifindex,
            addr: u32::from(addr),
        }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterKey {
    /// The LB IP ([`IpKey`]: IPv4-mapped for IPv4).
    pub ip: IpKey,
    /// Egress interface.
    pub ifindex: u32,
    /// [`crate::Kind`], [`crate::Origin`], [`crate::Ownership`], [`crate::Verdict`] as u8.
    pub kind: u8,
    pub origin: u8,
    pub state: u8,
    pub verdict: u8,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CounterValue {
    pub packets: u64,
    pub bytes: u64,
}

/// Indexes into [`MAP_STATS`].
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stat {
    /// Every frame the program saw.
    Frames = 0,
    /// ARP frames (any opcode, any validity).
    Arp = 1,
    /// ARP frames that were truncated, not Ethernet/IPv4, or had another opcode.
    ArpMalformed = 2,
    /// Valid ARP whose SPA is not an LB IP (passed).
    ArpNotLb = 3,
    /// A decision could not be counted because [`MAP_COUNTERS`] was full.
    CounterMapFull = 4,
    /// A rewrite failed at `bpf_skb_store_bytes`; the frame was dropped instead.
    RewriteFailed = 5,
    /// ARP frames whose VLAN tag travelled in skb metadata (a VLAN device or
    /// a VLAN-filtering bridge above the interface), not in the frame data.
    VlanInMetadata = 6,
    /// Announcements of LB IPs not owned here judged while the daemon's
    /// heartbeat was stale (foreign judged as unknown). An owned IP passes
    /// without a look at the heartbeat, so it is never counted here.
    HeartbeatStale = 7,
    /// Announcements of LB IPs not owned here passed unjudged because the
    /// heartbeat was dead.
    HeartbeatDeadPassed = 8,
    /// Drop events handed to userspace.
    EventsDelivered = 9,
    /// Drop events held back by the rate limit (or a full ring buffer).
    EventsSuppressed = 10,
    /// IPv6 Neighbor Solicitations and Advertisements (valid or not).
    Ndp = 11,
    /// NDP messages its receiver discards (hop limit, code, length,
    /// malformed options) or cut short: passed.
    NdpMalformed = 12,
    /// Valid NDP whose claimed address is not an LB IP (passed).
    NdpNotLb = 13,
    /// IPv6 not followed to its upper layer (more extension headers than
    /// looked through, or cut before it): passed unjudged, though it may be
    /// NDP. A fail-open limit worth an alert if it ever counts.
    Ipv6Unfollowed = 14,
    /// Dropped announcements of foreign IPs copied to the daemon, which
    /// re-sends them if this node becomes the owner within its window.
    AnnounceDeferred = 15,
    /// Dropped announcements that could not be copied (ring buffer full,
    /// frame longer than [`HELD_FRAME_MAX`]): lost if a takeover follows.
    AnnounceDeferFailed = 16,
}

impl Stat {
    pub const ALL: &'static [Stat] = &[
        Stat::Frames,
        Stat::Arp,
        Stat::ArpMalformed,
        Stat::ArpNotLb,
        Stat::CounterMapFull,
        Stat::RewriteFailed,
        Stat::VlanInMetadata,
        Stat::HeartbeatStale,
        Stat::HeartbeatDeadPassed,
        Stat::EventsDelivered,
        Stat::EventsSuppressed,
        Stat::Ndp,
        Stat::NdpMalformed,
        Stat::NdpNotLb,
        Stat::Ipv6Unfollowed,
        Stat::AnnounceDeferred,
        Stat::AnnounceDeferFailed,
    ];
    pub const COUNT: u32 = Self::ALL.len() as u32;

    pub const fn as_str(self) -> &'static str {
        match self {
            Stat::Frames => "frames",
            Stat::Arp => "arp",
            Stat::ArpMalformed => "malformed",
            Stat::ArpNotLb => "not_lb",
            Stat::CounterMapFull => "counter_map_full",
            Stat::RewriteFailed => "rewrite_failed",
            Stat::VlanInMetadata => "arp_vlan_in_metadata",
            Stat::HeartbeatStale => "heartbeat_stale",
            Stat::HeartbeatDeadPassed => "heartbeat_dead_passed",
            Stat::EventsDelivered => "events_delivered",
            Stat::EventsSuppressed => "events_suppressed",
            Stat::Ndp => "ndp",
            Stat::NdpMalformed => "ndp_malformed",
            Stat::NdpNotLb => "ndp_not_lb",
            Stat::Ipv6Unfollowed => "ipv6_unfollowed",
            Stat::AnnounceDeferred => "announce_deferred",
            Stat::AnnounceDeferFailed => "announce_defer_failed",
        }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Config {
    /// [`crate::Mode`] as u8.
    pub mode: u8,
    /// [`crate::LeakAction`] as u8.
    pub leak_action: u8,
    /// 1: copy dropped announcements of foreign IPs to the daemon
    /// ([`MAP_HELD`]; `--announce-hold` is not 0).
    pub defer: u8,
    pub _pad: [u8; 5],
    /// Heartbeat age from which foreign is judged as unknown (ns).
    pub stale_after_ns: u64,
    /// Heartbeat age from which everything passes (ns).
    pub dead_after_ns: u64,
    /// Drop events per second per CPU, and the burst allowed.
    pub events_per_sec: u32,
    pub events_burst: u32,
    /// The responder census: a silence this long (ns) ends a run of claims.
    pub census_window_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_slots_are_in_range_and_spread() {
        let mut seen = [(0u32, 0u64); 256];
        for (i, slot) in seen.iter_mut().enumerate() {
            let (word, bit) = lb_filter_slot(0x0a40_0000 + i as u32);
            assert!(word < LB_FILTER_WORDS);
            assert_eq!(bit.count_ones(), 1);
            *slot = (word, bit);
        }
        // A /24 pool lands on 256 distinct bits.
        seen.sort_unstable();
        assert!(seen.windows(2).all(|w| w[0] != w[1]));
    }

    #[test]
    fn token_bucket() {
        let s = 1_000_000_000u64;
        let mut b = RateLimit {
            tokens_micro: 0,
            last_ns: 0,
        };
        // Starts full after a long idle time: `burst` events pass, then none.
        let passed = (0..20)
            .filter(|_| take_token(&mut b, 100 * s, 10, 5))
            .count();
        assert_eq!(passed, 5);
        // Half a second later at 10/s: five more.
        let passed = (0..20)
            .filter(|_| take_token(&mut b, 100 * s + s / 2, 10, 5))
            .count();
        assert_eq!(passed, 5);
        // Clock going backwards refills nothing.
        assert!(!take_token(&mut b, 50 * s, 10, 5));
        assert_eq!(core::mem::size_of::<DropEvent>(), 56);
        assert_eq!(core::mem::size_of::<CounterKey>(), 24);
        assert_eq!(core::mem::size_of::<LbEntry>(), 4);
        assert_eq!(core::mem::size_of::<HeldFrame>(), 40 + HELD_FRAME_MAX);
        // The watch flag is not part of an entry's value.
        let mut e = LbEntry::new(crate::Ownership::Owned);
        assert_eq!(e.watch, 1);
        e.watch = 0;
        assert_eq!(e, LbEntry::new(crate::Ownership::Owned));
        assert_eq!(LbEntry::new(crate::Ownership::Foreign).watch, 0);
        assert_eq!(v4_key(0xc633_6401)[10..], [0xff, 0xff, 198, 51, 100, 1]);
        for ip in ["198.51.100.1", "fd00::1", "::1"] {
            let ip: core::net::IpAddr = ip.parse().unwrap();
            assert_eq!(ip_of_key(key_of_ip(ip)), ip);
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    /// `aya::Pod` for map keys and values: all of these are `#[repr(C)]`,
    /// made only of integers, with the padding spelled out as fields, so
    /// every bit pattern is valid.
    macro_rules! pod {
        ($($t:ty),*) => {$(
            // SAFETY: see the macro's comment: repr(C), integers only, no
            // implicit padding.
            unsafe impl aya::Pod for $t {}
        )*};
    }
    pod!(
        super::LbEntry,
        super::IfAddrKey,
        super::VlanKey,
        super::CounterKey,
        super::CounterValue,
        super::Config,
        super::DropEvent,
        super::RateLimit,
        super::HeldFrame
    );
}
