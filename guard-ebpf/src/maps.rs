//! The egress program's maps, one per job (names and layouts are
//! `guard_common::maps`; the census keeps its own in `census.rs`), and the
//! one read that spares most frames a hash lookup ([`may_be_lb`]).

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use guard_common::{
    Config, CounterKey, CounterValue, IfAddrKey, IpKey, LbEntry, RateLimit, Stat, VlanKey,
    HELD_RING_BYTES, LB_FILTER_WORDS, MAX_COUNTERS, MAX_IF_ADDRS, MAX_LB_IPS,
};

/// Linux's BPF_F_NO_PREALLOC: the counter map grows with use instead of
/// reserving MAX_COUNTERS x CPUs entries up front.
const BPF_F_NO_PREALLOC: u32 = 1;

#[map(name = "LB_IPS")]
pub(crate) static LB_IPS: HashMap<u32, LbEntry> = HashMap::with_max_entries(MAX_LB_IPS, 0);

/// Allocated on use: most clusters have few IPv6 LB IPs, if any.
#[map(name = "LB_IPS6")]
pub(crate) static LB_IPS6: HashMap<IpKey, LbEntry> =
    HashMap::with_max_entries(MAX_LB_IPS, BPF_F_NO_PREALLOC);

#[map(name = "LB_FILTER")]
static LB_FILTER: Array<u64> = Array::with_max_entries(LB_FILTER_WORDS, 0);

#[map(name = "IF_ADDRS")]
pub(crate) static IF_ADDRS: HashMap<IfAddrKey, u8> = HashMap::with_max_entries(MAX_IF_ADDRS, 0);

#[map(name = "IF_PRIMARY")]
pub(crate) static IF_PRIMARY: HashMap<u32, u32> = HashMap::with_max_entries(MAX_IF_ADDRS, 0);

#[map(name = "VLAN_UPPERS")]
pub(crate) static VLAN_UPPERS: HashMap<VlanKey, u32> = HashMap::with_max_entries(MAX_IF_ADDRS, 0);

#[map(name = "COUNTERS")]
pub(crate) static COUNTERS: PerCpuHashMap<CounterKey, CounterValue> =
    PerCpuHashMap::with_max_entries(MAX_COUNTERS, BPF_F_NO_PREALLOC);

#[map(name = "STATS")]
pub(crate) static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Stat::COUNT, 0);

#[map(name = "CONFIG")]
pub(crate) static CONFIG: Array<Config> = Array::with_max_entries(1, 0);

#[map(name = "HEARTBEAT")]
pub(crate) static HEARTBEAT: Array<u64> = Array::with_max_entries(1, 0);

#[map(name = "EVENTS")]
pub(crate) static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

#[map(name = "EVENT_RATE")]
pub(crate) static EVENT_RATE: PerCpuArray<RateLimit> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "HELD")]
pub(crate) static HELD: RingBuf = RingBuf::with_byte_size(HELD_RING_BYTES, 0);

/// Whether `ip` may be an LB IP: a clear bit in LB_FILTER proves it is
/// not, with an array read the verifier inlines (no call, unlike the hash
/// lookup it spares ARP from node addresses). Fails open to the lookup.
#[inline(always)]
pub(crate) fn may_be_lb(ip: u32) -> bool {
    let (word, bit) = guard_common::lb_filter_slot(ip);
    LB_FILTER.get(word).is_none_or(|w| *w & bit != 0)
}
