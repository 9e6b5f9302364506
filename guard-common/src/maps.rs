//! The BPF maps shared between the program and userspace: one map per job,
//! `#[repr(C)]` keys and values with explicit padding.

/// LB IP (host-order u32) -> [`LbEntry`]. The LB set and this node's view of
/// each IP's owner. An IP absent from this map is not an LB IP.
pub const MAP_LB_IPS: &str = "LB_IPS";
/// [`IfAddrKey`] -> u8 (1). IPv4 addresses configured on guarded interfaces,
/// for the "LB IP is on the egress interface" (arp_ignore=1) rule.
pub const MAP_IF_ADDRS: &str = "IF_ADDRS";
/// ifindex -> primary IPv4 (host-order u32), used to rewrite announce leaks.
pub const MAP_IF_PRIMARY: &str = "IF_PRIMARY";
/// Per-CPU [`CounterKey`] -> [`CounterValue`]: one counter per decision.
pub const MAP_COUNTERS: &str = "COUNTERS";
/// Per-CPU array of u64 indexed by [`Stat`]: totals that have no LB IP.
pub const MAP_STATS: &str = "STATS";
/// Array with one [`Config`] at index 0.
pub const MAP_CONFIG: &str = "CONFIG";
/// Array with one u64 at index 0: the daemon's last heartbeat, CLOCK_MONOTONIC ns.
pub const MAP_HEARTBEAT: &str = "HEARTBEAT";

/// Capacity of [`MAP_LB_IPS`].
pub const MAX_LB_IPS: u32 = 65_536;
/// Capacity of the address maps.
pub const MAX_IF_ADDRS: u32 = 4_096;
/// Capacity of [`MAP_COUNTERS`]. Allocated on demand (BPF_F_NO_PREALLOC).
pub const MAX_COUNTERS: u32 = 65_536;

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LbEntry {
    /// [`crate::Ownership`] as u8.
    pub state: u8,
    pub _pad: [u8; 3],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IfAddrKey {
    pub ifindex: u32,
    pub addr: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterKey {
    /// The LB IP (host order).
    pub ip: u32,
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
    Malformed = 2,
    /// Valid ARP whose SPA is not an LB IP (passed).
    NotLb = 3,
    /// A decision could not be counted because [`MAP_COUNTERS`] was full.
    CounterFull = 4,
    /// A rewrite failed at `bpf_skb_store_bytes`; the frame was dropped instead.
    RewriteFailed = 5,
    /// ARP frames whose VLAN tag travelled in skb metadata (a VLAN device or
    /// a VLAN-filtering bridge above the interface), not in the frame data.
    VlanInMetadata = 6,
    /// LB announcements judged while the daemon's heartbeat was stale
    /// (foreign judged as unknown).
    GateStale = 7,
    /// LB announcements passed unjudged because the heartbeat was dead.
    GateOpen = 8,
}

impl Stat {
    pub const ALL: &'static [Stat] = &[
        Stat::Frames,
        Stat::Arp,
        Stat::Malformed,
        Stat::NotLb,
        Stat::CounterFull,
        Stat::RewriteFailed,
        Stat::VlanInMetadata,
        Stat::GateStale,
        Stat::GateOpen,
    ];
    pub const COUNT: u32 = Self::ALL.len() as u32;

    pub const fn as_str(self) -> &'static str {
        match self {
            Stat::Frames => "frames",
            Stat::Arp => "arp",
            Stat::Malformed => "malformed",
            Stat::NotLb => "not_lb",
            Stat::CounterFull => "counter_map_full",
            Stat::RewriteFailed => "rewrite_failed",
            Stat::VlanInMetadata => "arp_vlan_in_metadata",
            Stat::GateStale => "heartbeat_stale",
            Stat::GateOpen => "heartbeat_dead_passed",
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
    pub _pad: [u8; 6],
    /// Heartbeat age from which foreign is judged as unknown (ns).
    pub stale_after_ns: u64,
    /// Heartbeat age from which everything passes (ns).
    pub dead_after_ns: u64,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are #[repr(C)], made only of integers, with the
    // padding spelled out as fields, so every bit pattern is valid.
    unsafe impl aya::Pod for super::LbEntry {}
    unsafe impl aya::Pod for super::IfAddrKey {}
    unsafe impl aya::Pod for super::CounterKey {}
    unsafe impl aya::Pod for super::CounterValue {}
    unsafe impl aya::Pod for super::Config {}
}
