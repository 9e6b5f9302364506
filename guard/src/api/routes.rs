//! The API's routes (axum): what each path answers, from the shared state.
//! GET and HEAD only (axum answers 405 with an Allow header otherwise).

use std::{
    collections::BTreeMap,
    convert::Infallible,
    net::IpAddr,
    sync::{atomic::AtomicBool, Arc},
    time::Duration,
};

use axum::{
    body::Body,
    extract::{Query, State},
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Extension, Router,
};
use bytes::Bytes;
use guard_common::{decide, Facts, Kind, LeakAction, Liveness, Mode, Origin, Verdict};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use super::{
    state::{unix_now, Shared},
    types::{
        takeover_summary, CensusSummary, ClientsRow, ConflictRow, Explanation, IpRow, StatusDoc,
        Would,
    },
    MAX_EVENT_STREAMS,
};
use crate::telemetry::{
    census::CensusDoc,
    metrics::{self, Scrape},
};

/// Set by `/events` on its connection: an event stream is not cut by the
/// server's per-connection time limit.
#[derive(Clone, Default)]
pub struct Streaming(pub Arc<AtomicBool>);

/// What `router` serves, for the start-up log line.
pub const ALL_PATHS: &str =
    "/metrics /healthz /readyz /status /explain /events /counters /responders /clients /cluster /probes";

/// `/metrics` alone: what `--metrics-listen` exposes off the node.
pub fn metrics_router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_route))
        .fallback(|| async { text(StatusCode::NOT_FOUND, "not found: only /metrics here\n") })
        .with_state(shared)
}

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz_route))
        .route("/metrics", get(metrics_route))
        .route("/status", get(status))
        .route("/explain", get(explain_route))
        .route("/counters", get(counters))
        .route("/events", get(events))
        .route("/responders", get(responders))
        .route("/clients", get(clients))
        .route("/probes", get(probes))
        .route("/cluster", get(cluster))
        .fallback(not_found)
        .with_state(shared)
}

fn text(code: StatusCode, body: impl Into<String>) -> Response {
    (code, [(header::CONTENT_TYPE, "text/plain")], body.into()).into_response()
}

fn json(v: &impl Serialize) -> Response {
    let body = serde_json::to_string_pretty(v).unwrap_or_default() + "\n";
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

async fn not_found() -> Response {
    text(
        StatusCode::NOT_FOUND,
        "not found: try /metrics /healthz /readyz /status /explain?ip= /events /counters /responders[?ip=] /clients[?ip=] /cluster /probes\n",
    )
}

/// Alive means the main loop still writes heartbeats, not only that this
/// task answers.
async fn healthz(State(shared): State<Arc<Shared>>) -> Response {
    match shared.heartbeat_age() {
        Some(age) if age < Duration::from_secs(10) => text(StatusCode::OK, "ok\n"),
        age => text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("main loop stalled: last heartbeat {age:?} ago\n"),
        ),
    }
}

async fn readyz_route(State(shared): State<Arc<Shared>>) -> Response {
    let (code, body) = readyz(&shared);
    text(code, body)
}

/// Ready: attached everywhere asked, synced, and `/metrics` can read the
/// kernel counters (metrics that cannot leave every dashboard and alert
/// blind); else 503 with the reasons.
pub(crate) fn readyz(shared: &Shared) -> (StatusCode, String) {
    let mut not_ready = shared.read().not_ready.clone();
    if let Err(e) = shared.stats_readable() {
        not_ready.push(format!("/metrics cannot read the kernel counters: {e:#}"));
    }
    if not_ready.is_empty() {
        (StatusCode::OK, "ready\n".into())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", not_ready.join("; ")),
        )
    }
}

async fn metrics_route(State(shared): State<Arc<Shared>>) -> Response {
    let rendered = shared.snapshot().and_then(|snapshot| {
        let st = shared.read();
        let mut fold = shared.fold.lock().unwrap_or_else(|p| p.into_inner());
        let scrape = Scrape {
            snapshot: &snapshot,
            fold: &mut fold,
            max_ip_series: shared.metrics_max_ip_series,
            status: st.status.as_ref(),
            feed_unhealthy_seconds: st.feed_enabled.then(|| {
                st.feed_failing_since
                    .map_or(0.0, |t| t.elapsed().as_secs_f64())
            }),
            census: st.census.as_ref(),
            takeover: st.takeover.as_ref(),
            clients: st.clients.as_ref(),
            ops: &shared.ops,
            presence_nodes: st.presence.as_ref().map(|p| {
                let live = p.table.live().len();
                let mut v = vec![
                    ("live", live as f64),
                    ("not_ready", (p.table.nodes.len() - live) as f64),
                ];
                // Unknown (Nodes not read lately: only the guard that keeps
                // coverage reads them on a timer) is no series at all, not
                // 0: the alert takes the lowest count across guards, and a
                // 0 from a guard that cannot see would silence it.
                let fresh = p.nodes_unix.is_some_and(|t| {
                    unix_now() as i64 - t <= crate::model::presence::UNCOVERED_FRESH_S
                });
                if let Some(u) = p.uncovered().filter(|_| fresh) {
                    v.push(("uncovered", u.len() as f64));
                }
                v
            }),
            probes: st.probes.as_ref(),
            memory: st.memory.as_ref(),
        };
        Ok(metrics::render(scrape)?)
    });
    match rendered {
        Ok(body) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}\n")),
    }
}

async fn status(State(shared): State<Arc<Shared>>) -> Response {
    let snap = shared.snapshot().ok();
    let mut by_ip: BTreeMap<IpAddr, BTreeMap<Verdict, u64>> = BTreeMap::new();
    for r in snap.iter().flat_map(|s| s.rows.iter()) {
        if let Some(v) = Verdict::from_u8(r.key.verdict) {
            let ip = guard_common::ip_of_key(r.key.ip);
            *by_ip.entry(ip).or_default().entry(v).or_default() += r.value.packets;
        }
    }
    let st = shared.read();
    json(&StatusDoc {
        version: env!("CARGO_PKG_VERSION").into(),
        status: st.status.clone(),
        ready: st.not_ready.is_empty(),
        not_ready: st.not_ready.clone(),
        ips: st
            .ips
            .iter()
            .map(|(ip, entry)| IpRow {
                ip: *ip,
                family: guard_common::family(ip).into(),
                entry: entry.clone(),
                counters: by_ip.remove(ip).unwrap_or_default(),
                takeover: st.takeovers.get(ip).cloned(),
            })
            .collect(),
        conflicts: st.census.as_ref().map(ConflictRow::all).unwrap_or_default(),
        census: (st.census.as_ref()).map(|c| CensusSummary::of(c, st.clients.as_ref())),
        takeovers: st.takeover.as_ref().map(takeover_summary),
        clients: st.clients.as_ref().map(ClientsRow::all).unwrap_or_default(),
    })
}

#[derive(Deserialize)]
struct ExplainParams {
    ip: Option<String>,
}

async fn explain_route(
    State(shared): State<Arc<Shared>>,
    Query(p): Query<ExplainParams>,
) -> Response {
    match ip_param(p.ip.as_deref(), "/explain") {
        Ok(Some(ip)) => json(&explain(&shared, ip)),
        Ok(None) => text(
            StatusCode::BAD_REQUEST,
            "use /explain?ip=IP (IPv4 or IPv6)\n",
        ),
        Err(r) => *r,
    }
}

/// The `?ip=` of a per-IP document: none, an IP, or a 400 saying how (boxed:
/// a Response is large and the error is the rare path).
fn ip_param(ip: Option<&str>, path: &str) -> Result<Option<IpAddr>, Box<Response>> {
    match ip.map(str::parse::<IpAddr>) {
        None => Ok(None),
        Some(Ok(ip)) => Ok(Some(ip)),
        Some(Err(_)) => Err(Box::new(text(
            StatusCode::BAD_REQUEST,
            format!("use {path}?ip=IP (IPv4 or IPv6)\n"),
        ))),
    }
}

/// Why this node treats `ip` as it does, and what the program would do with
/// each kind of frame from each origin on each uplink.
pub fn explain(shared: &Shared, ip: IpAddr) -> Explanation {
    let st = shared.read();
    let entry = st.ips.get(&ip);
    let (mode, leak_action) = (
        st.mode.unwrap_or(Mode::Enforce),
        st.leak_action.unwrap_or(LeakAction::Rewrite),
    );
    let mut would = Vec::new();
    if let Some(e) = entry {
        for (iface, has_v4) in &st.uplinks {
            // ARP kinds for an IPv4 address, NDP kinds for an IPv6 one.
            let kinds = Kind::ALL.iter().filter(|k| k.is_ndp() == ip.is_ipv6());
            for &kind in kinds {
                for &origin in Origin::ALL {
                    let verdict = decide(&Facts {
                        kind,
                        origin,
                        state: e.state,
                        ip_on_egress: e.on_interfaces.contains(iface),
                        egress_has_ipv4: *has_v4,
                        mode,
                        leak_action,
                        liveness: Liveness::Fresh,
                    });
                    would.push(Would {
                        interface: iface.clone(),
                        kind,
                        origin,
                        verdict,
                    });
                }
            }
        }
    }
    Explanation {
        ip,
        family: guard_common::family(&ip).into(),
        lb_ip: entry.is_some(),
        state: entry.map(|e| e.state),
        source: entry.map(|e| e.source.clone()),
        known_for_seconds: entry.map(|e| unix_now().saturating_sub(e.since_unix)),
        mode: st.mode,
        leak_action: st.leak_action,
        heartbeat: match shared.heartbeat_age() {
            Some(a) if a < Duration::from_secs(2) => "fresh",
            Some(_) => "late (the main loop is behind; the program judges by its own thresholds)",
            None => "none yet",
        }
        .into(),
        takeover: st.takeovers.get(&ip).cloned(),
        split: entry.and_then(|e| e.split.clone()),
        would,
    }
}

#[derive(Deserialize)]
struct RespondersParams {
    ip: Option<String>,
}

/// The responder census; with `?ip=`, that IP only (an empty table if
/// nothing claimed it). 404 when the census is off.
async fn responders(
    State(shared): State<Arc<Shared>>,
    Query(p): Query<RespondersParams>,
) -> Response {
    let ip = match ip_param(p.ip.as_deref(), "/responders") {
        Ok(ip) => ip,
        Err(r) => return *r,
    };
    let st = shared.read();
    let Some(doc) = st.census.as_ref() else {
        return text(
            StatusCode::NOT_FOUND,
            "the responder census is off (--no-census, or it could not load: see the log)\n",
        );
    };
    match ip {
        None => json(doc),
        // Only that IP is copied out of the table.
        Some(ip) => json(&CensusDoc {
            window_seconds: doc.window_seconds,
            entries: doc.entries,
            capacity: doc.capacity,
            totals: doc.totals.clone(),
            error: doc.error.clone(),
            claims: Default::default(),
            ips: doc
                .ips
                .get(&ip)
                .map(|c| (ip, c.clone()))
                .into_iter()
                .collect(),
        }),
    }
}

/// The active census: this node's share of the LB IPs and their verdicts.
/// 404 when it does not run.
async fn probes(State(shared): State<Arc<Shared>>) -> Response {
    match shared.read().probes.as_ref() {
        Some(doc) => json(doc),
        None => text(
            StatusCode::NOT_FOUND,
            "the active census does not run (--probe-interval 0, presence off, or the census off: see the log)\n",
        ),
    }
}

/// Every guard of the cluster and the nodes without one (presence). The
/// Nodes are read for the asker (from a list at most half a minute old),
/// waiting a moment for them: presence reads them only when asked, or on
/// the one guard that keeps coverage.
async fn cluster(State(shared): State<Arc<Shared>>) -> Response {
    let nodes_unix = |s: &Shared| s.read().presence.as_ref().and_then(|p| p.nodes_unix);
    let before = nodes_unix(&shared);
    let on = shared.read().presence.is_some();
    if on && before.is_none_or(|t| unix_now() as i64 - t >= 30) {
        shared.nodes_wanted.notify_one();
        for _ in 0..NODES_WAIT_STEPS {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            if nodes_unix(&shared) != before {
                break;
            }
        }
    }
    let now = unix_now() as i64;
    json(&super::cluster::ClusterDoc::of(
        shared.read().presence.as_ref(),
        now,
    ))
}

/// `/cluster` waits at most this many tenths of a second for the Nodes.
const NODES_WAIT_STEPS: u32 = 30;

/// Misdirected and stale clients; with `?ip=`, that LB IP only (an empty
/// table if no client of it came here). 404 when the census is off.
async fn clients(State(shared): State<Arc<Shared>>, Query(p): Query<RespondersParams>) -> Response {
    let ip = match ip_param(p.ip.as_deref(), "/clients") {
        Ok(ip) => ip,
        Err(r) => return *r,
    };
    let st = shared.read();
    let Some(doc) = st.clients.as_ref() else {
        return text(
            StatusCode::NOT_FOUND,
            "the census is off (--no-census, or it could not load: see the log): no client is seen\n",
        );
    };
    match ip {
        None => json(doc),
        Some(ip) => json(&doc.only(ip)),
    }
}

#[derive(Deserialize)]
struct CountersParams {
    interface: Option<String>,
}

/// The kernel counters; with `?interface=NAME`, that interface's rows (404
/// if the guard is not attached there).
async fn counters(State(shared): State<Arc<Shared>>, Query(p): Query<CountersParams>) -> Response {
    if let Some(i) = &p.interface {
        if !shared.read().uplinks.contains_key(i) {
            return text(
                StatusCode::NOT_FOUND,
                format!("the guard is not attached to {i}\n"),
            );
        }
    }
    match shared.snapshot() {
        Ok(snap) => json(&snap.to_doc().only(p.interface.as_deref())),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}\n")),
    }
}

/// A live stream of drop events, one JSON object per line.
async fn events(
    State(shared): State<Arc<Shared>>,
    Extension(streaming): Extension<Streaming>,
) -> Response {
    if shared.events.receiver_count() >= MAX_EVENT_STREAMS {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("too many event streams (at most {MAX_EVENT_STREAMS})\n"),
        );
    }
    streaming
        .0
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let rx = shared.events.subscribe();
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        let line = match rx.recv().await {
            Ok(line) => line + "\n",
            // A slow reader: say how much it missed and go on.
            Err(broadcast::error::RecvError::Lagged(n)) => format!("{{\"lagged\":{n}}}\n"),
            Err(broadcast::error::RecvError::Closed) => return None,
        };
        Some((Ok::<_, Infallible>(Bytes::from(line)), rx))
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response()
}
