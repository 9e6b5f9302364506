//! What one watch event costs the feed itself, without any I/O: the line
//! decoded, the object applied to the store, the view compared (and built
//! when it changed). For the benches (`testing` feature): the transport's
//! share (HTTP, TCP, wake-ups) is measured there against a bare reader.

use std::time::{Duration, Instant};

use super::per_stream::StreamId;
use super::{
    decode::{self, Lease, Service, WatchLine},
    feed::Feed,
    stream::{Event, Msg, Update},
    FeedConfig,
};

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which lives on this stack.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn service_json(i: usize) -> String {
    format!(
        r#"{{"metadata":{{"name":"svc-{i}","namespace":"default","resourceVersion":"{i}"}},"spec":{{"type":"LoadBalancer","ports":[{{"port":443,"protocol":"TCP"}}]}},"status":{{"loadBalancer":{{"ingress":[{{"ip":"10.{}.{}.{}","ipMode":"VIP"}}]}}}}}}"#,
        64 + i / 65536,
        (i / 256) % 256,
        i % 256
    )
}

/// A Lease as a watch line carries it (with its managed fields).
fn lease_line(i: usize, holder: &str, k: usize) -> Vec<u8> {
    format!(
        r#"{{"type":"MODIFIED","object":{{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{{"name":"cilium-l2announce-default-svc-{i}","namespace":"kube-system","resourceVersion":"{}","uid":"uid-{i}","managedFields":[{{"apiVersion":"coordination.k8s.io/v1","fieldsType":"FieldsV1","fieldsV1":{{"f:spec":{{"f:acquireTime":{{}},"f:holderIdentity":{{}},"f:leaseDurationSeconds":{{}},"f:leaseTransitions":{{}},"f:renewTime":{{}}}}}},"manager":"cilium-agent","operation":"Update","time":"2026-11-30T10:00:00Z"}}]}},"spec":{{"holderIdentity":"{holder}","leaseDurationSeconds":15,"acquireTime":"2026-11-30T10:00:00.000000Z","renewTime":"2026-11-30T10:{:02}:{:02}.{:06}Z","leaseTransitions":0}}}}}}"#,
        1000 + k,
        (k / 60) % 60,
        k % 60,
        k % 1_000_000
    )
    .into_bytes()
}

/// The CPU a Cilium feed with `n` LB Services spends per event, in-process:
/// a renewal that changes nothing, and a holder move (which changes a claim
/// and publishes a view). `events` of each are timed.
pub struct Costs {
    pub renewal: Duration,
    pub holder_move: Duration,
}

fn holder(i: usize) -> &'static str {
    if i.is_multiple_of(2) {
        "node-a"
    } else {
        "node-b"
    }
}

/// A feed that has listed `n` Services and their Leases, with its view published.
fn listed(n: usize, now: Instant) -> Feed {
    let mut f = Feed::new(
        FeedConfig::cilium(Duration::from_secs(55)),
        now,
        Default::default(),
    );
    let svc = |e| Msg::Update(Update::Svc(Box::new(e)));
    let lease = |e| Msg::Update(Update::Lease(Box::new(e)));
    f.on_msg(StreamId::nth(0), svc(Event::Listing), now);
    f.on_msg(StreamId::nth(1), lease(Event::Listing), now);
    for i in 0..n {
        let s = decode::decode::<Service>(&service_json(i));
        f.on_msg(StreamId::nth(0), svc(Event::Listed(s)), now);
        let line = lease_line(i, holder(i), 0);
        if let Ok(WatchLine::Modified(l)) = decode::watch_line::<Lease>(&line) {
            f.on_msg(StreamId::nth(1), lease(Event::Listed(l)), now);
        }
    }
    f.on_msg(StreamId::nth(0), svc(Event::ListDone), now);
    f.on_msg(StreamId::nth(1), lease(Event::ListDone), now);
    let _ = f.changed_view(now, None);
    f
}

/// One watch line through the feed as the task handles it; whether the view
/// changed.
fn handle(f: &mut Feed, line: &[u8], now: Instant) -> bool {
    if let Ok(WatchLine::Modified(l)) = decode::watch_line::<Lease>(line) {
        f.on_msg(
            StreamId::nth(1),
            Msg::Update(Update::Lease(Box::new(Event::Apply(l)))),
            now,
        );
    }
    let _ = f.due_confirmations(now, 0);
    f.changed_view(now, Some(now)).is_some()
}

/// See [`Costs`]. Panics if a renewal changed the view or a move did not
/// (the bench would measure something else).
pub fn costs(n: usize, events: usize) -> Costs {
    let now = Instant::now();
    let mut f = listed(n, now);
    let lines: Vec<Vec<u8>> = (0..events)
        .map(|k| lease_line(k % n, holder(k % n), k + 1))
        .collect();
    let t = thread_cpu();
    for l in &lines {
        assert!(!handle(&mut f, l, now), "a renewal changed the view");
    }
    let renewal = (thread_cpu() - t) / events as u32;
    // Each move flips one Lease's holder.
    let mut on_a: Vec<bool> = (0..n).map(|i| holder(i) == "node-a").collect();
    let moves: Vec<Vec<u8>> = (0..events)
        .map(|k| {
            let i = (k * 7919) % n;
            on_a[i] = !on_a[i];
            let to = if on_a[i] { "node-a" } else { "node-b" };
            lease_line(i, to, events + k + 1)
        })
        .collect();
    let t = thread_cpu();
    for l in &moves {
        let _ = handle(&mut f, l, now);
    }
    let holder_move = (thread_cpu() - t) / events as u32;
    Costs {
        renewal,
        holder_move,
    }
}

/// Bytes the allocator hands out, now (glibc).
fn heap_in_use() -> usize {
    // SAFETY: mallinfo2 only reads the allocator's statistics.
    let m = unsafe { libc::mallinfo2() };
    m.uordblks + m.hblkhd
}

/// Heap bytes a feed holds once it has listed `n` LB Services and their
/// Leases and published its claims (the store, its indexes, the claims
/// table shared with the daemon).
pub fn feed_bytes(n: usize) -> usize {
    let before = heap_in_use();
    let f = listed(n, Instant::now());
    let after = heap_in_use();
    drop(f);
    after.saturating_sub(before)
}
