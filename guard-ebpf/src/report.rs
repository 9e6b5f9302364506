//! What the operator learns from the egress program: per-CPU totals
//! ([`bump`]), a counter per LB IP and decision ([`count`]), and events,
//! rate-limited ([`emit`]) or one per change of state
//! ([`report_announcement`]).

use aya_ebpf::programs::TcContext;
use aya_log_ebpf::error;
use guard_common::{
    take_token, Config, CounterKey, CounterValue, DropEvent, Origin, Ownership, Stat, Verdict,
};

use crate::{
    claim::OutgoingClaim,
    maps::{COUNTERS, EVENTS, EVENT_RATE, STATS},
};

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

/// One more frame, and its bytes, for the decision `key` names. Returns
/// true the first time this CPU finds the map full: the caller then says so
/// ([`log_counter_map_full`]) once its work on the frame is done.
#[inline(always)]
pub(crate) fn count(ctx: &TcContext, key: CounterKey) -> bool {
    let bytes = u64::from(ctx.len());
    if let Some(v) = COUNTERS.get_ptr_mut(&key) {
        // SAFETY: per-CPU value, only this CPU writes it while we run.
        unsafe {
            (*v).packets += 1;
            (*v).bytes += bytes;
        }
        return false;
    }
    let fresh = CounterValue { packets: 1, bytes };
    // Two CPUs may insert the same new key at once; each insert writes only
    // its own CPU's slot (the others are zeroed), so no count is lost.
    COUNTERS.insert(&key, &fresh, 0).is_err() && bump(Stat::CounterMapFull) == 1
}

/// Once per CPU: the STATS counter keeps the tally, this only points at it.
/// Called last in `act`, where the frame's judgement is done: aya-log's
/// record writer (a subprogram of ~500 instructions) is verified once for
/// every distinct state that reaches its call, and inside `count` that was
/// every path through the judgement (109,826 instructions verified for the
/// egress program on Linux 6.18; 44,986 with the call here).
#[inline(always)]
pub(crate) fn log_counter_map_full(ctx: &TcContext) {
    error!(ctx, "arp-guard: counter map full; decisions are no longer counted per LB IP (see STATS counter_map_full)");
}

/// One event for the operator, within the per-CPU rate limit: a storm of
/// frames cannot flood userspace; what is held back is counted. The event
/// is built only once a token allows it.
#[inline(always)]
pub(crate) fn emit(
    c: &OutgoingClaim,
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
    send(&c.event(ifindex, origin, state, verdict, now));
}

/// An announcement passed for an IP whose entry asked to hear of the next
/// one (the daemon sets `watch` when an IP's state changes to owned or
/// unknown): one event, outside the drop events' rate limit (one per
/// change of state), and the flag cleared. Two CPUs may both report it;
/// the daemon keeps the first.
#[inline(always)]
pub(crate) fn report_announcement(
    c: &OutgoingClaim,
    ifindex: u32,
    origin: Origin,
    state: Ownership,
) {
    // SAFETY: a live element of an LB map; see `act`.
    unsafe {
        if (*c.entry).watch == 0 {
            return;
        }
        (*c.entry).watch = 0;
    }
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() };
    send(&c.event(ifindex, origin, state, Verdict::Passed, now));
}

#[inline(always)]
fn send(event: &DropEvent) {
    if EVENTS.output::<DropEvent>(event, 0).is_ok() {
        bump(Stat::EventsDelivered);
    } else {
        bump(Stat::EventsSuppressed);
    }
}
