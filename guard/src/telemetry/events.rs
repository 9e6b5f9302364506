//! Drop events from the kernel's ring buffer: logged with `tracing` (text or
//! JSON, per --log-format), bursts summarised, and fanned out to `/events`
//! subscribers (`arp-guard events`). The same ring carries the program's
//! reports of an announcement that left for an IP whose entry asked for it
//! (verdict `passed`): those go to the daemon's takeover timing instead.

use std::{collections::BTreeMap, time::Duration};

use aya::maps::{MapData, RingBuf};
use guard_common::{DropEvent, Kind, Origin, Ownership, Verdict};
use serde::{Deserialize, Serialize};
use tokio::{
    io::unix::AsyncFd,
    sync::{broadcast, mpsc},
};

use crate::model::{fmt_mac, takeover::Heard};

/// Per (LB IP, kind, verdict) and second, this many events are logged one by
/// one; the rest are summarised in one line.
const LOG_PER_KEY_PER_SEC: u32 = 5;

#[derive(Debug, Serialize, Deserialize)]
pub struct EventJson {
    pub time: String,
    pub interface: String,
    pub lb_ip: String,
    /// "ipv4" (ARP) or "ipv6" (NDP).
    #[serde(default)]
    pub family: String,
    pub requester_ip: String,
    pub requester_mac: String,
    pub kind: String,
    pub origin: String,
    pub state: String,
    pub verdict: String,
}

/// One record of the ring, as the program wrote it.
fn raw(bytes: &[u8]) -> Option<DropEvent> {
    if bytes.len() < std::mem::size_of::<DropEvent>() {
        return None;
    }
    // SAFETY: the buffer holds at least one DropEvent (checked above), a
    // #[repr(C)] struct of integers valid for any bits; read unaligned.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const DropEvent) })
}

/// A record the daemon's main loop hears of: an announcement that passed
/// (not a drop event), or a drop event of an IP foreign here that is a
/// speaker's or datapath responder's answer or announcement (what became
/// of it: `model::takeover::Fates`) or the kernel's answer (the node
/// answers for IPs it does not own). The second kind is a drop event too.
fn heard(e: &DropEvent) -> Option<Heard> {
    let verdict = match e.verdict {
        v if v == Verdict::Passed as u8 => Verdict::Passed,
        v if v == Verdict::Dropped as u8 => Verdict::Dropped,
        v if v == Verdict::WouldDrop as u8 => Verdict::WouldDrop,
        _ => return None,
    };
    let h = Heard {
        ip: guard_common::ip_of_key(e.lb_ip),
        at_ns: e.at_ns,
        via: Origin::from_u8(e.origin)?,
        state: Ownership::from_u8(e.state)?,
        kind: Kind::from_u8(e.kind)?,
        ifindex: e.ifindex,
        verdict,
    };
    let claim = matches!(
        h.kind,
        Kind::Reply | Kind::Gratuitous | Kind::NaSolicited | Kind::NaUnsolicited
    );
    (verdict == Verdict::Passed || (h.state == Ownership::Foreign && claim)).then_some(h)
}

pub fn decode(bytes: &[u8]) -> Option<EventJson> {
    let e = raw(bytes)?;
    let [kind, origin, state, verdict] =
        super::decision_names(e.kind, e.origin, e.state, e.verdict);
    let lb_ip = guard_common::ip_of_key(e.lb_ip);
    Some(EventJson {
        time: unix_time_millis(),
        interface: super::interface_name(e.ifindex),
        lb_ip: lb_ip.to_string(),
        family: guard_common::family(&lb_ip).into(),
        requester_ip: guard_common::ip_of_key(e.requester_ip).to_string(),
        requester_mac: fmt_mac(&e.requester_mac),
        kind,
        origin,
        state,
        verdict,
    })
}

/// Seconds since the Unix epoch with milliseconds, as text ("1764500000.123").
pub(crate) fn unix_time_millis() -> String {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("{}.{:03}", d.as_secs(), d.subsec_millis())
}

/// Read events until the ring buffer fails: log them (bursts summarised)
/// and hand each to `tx` as a line of JSON (no subscriber is fine); hand
/// reports of announcements that passed to `heard` (a full queue drops
/// them: the takeover they belong to is then timed by the next, or called
/// silent).
pub async fn run(
    ring: RingBuf<MapData>,
    tx: broadcast::Sender<String>,
    heard_tx: mpsc::Sender<Heard>,
) {
    // SAFETY: the RingBuf owns its fd and moves into the AsyncFd, so the fd
    // stays open until the AsyncFd (deregistering first) drops it.
    let mut fd = match unsafe { AsyncFd::register(ring) } {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(error = %e, "drop events unavailable");
            return;
        }
    };
    let mut window: BTreeMap<(String, String, String), u32> = BTreeMap::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            guard = fd.readable_mut() => {
                let Ok(mut guard) = guard else { return };
                let ring = guard.get_inner_mut();
                while let Some(item) = ring.next() {
                    if let Some(h) = raw(&item).as_ref().and_then(heard) {
                        let _ = heard_tx.try_send(h);
                        if h.verdict == Verdict::Passed {
                            continue;
                        }
                    }
                    let Some(ev) = decode(&item) else { continue };
                    let key = (ev.lb_ip.clone(), ev.kind.clone(), ev.verdict.clone());
                    let n = window.entry(key).or_default();
                    *n += 1;
                    if *n <= LOG_PER_KEY_PER_SEC {
                        tracing::info!(
                            target: "arp_guard::events",
                            interface = %ev.interface, lb_ip = %ev.lb_ip, requester_ip = %ev.requester_ip,
                            requester_mac = %ev.requester_mac, kind = %ev.kind, origin = %ev.origin, state = %ev.state,
                            verdict = %ev.verdict, family = %ev.family, "announcement stopped"
                        );
                    }
                    if let Ok(line) = serde_json::to_string(&ev) {
                        // No subscriber is fine.
                        let _ = tx.send(line);
                    }
                }
                guard.clear_ready();
            }
            _ = tick.tick() => {
                for ((lb_ip, kind, verdict), n) in std::mem::take(&mut window) {
                    if n > LOG_PER_KEY_PER_SEC {
                        tracing::info!(
                            target: "arp_guard::events",
                            lb_ip = %lb_ip, kind = %kind, verdict = %verdict, more = n - LOG_PER_KEY_PER_SEC,
                            "burst: more events like these in the last second"
                        );
                    }
                }
            }
        }
    }
}
