//! The daemon's local HTTP API: `/metrics` (Prometheus text), `/healthz`,
//! `/readyz`, `/status`, `/explain?ip=`, `/events`. It listens on
//! `--listen` (loopback by default: exposing it off the host is a deliberate
//! choice). `arp-guard status|explain|events` are clients of it.

use std::{
    collections::BTreeMap,
    convert::Infallible,
    net::{Ipv4Addr, SocketAddr},
    sync::{atomic::AtomicU64, Arc, Mutex, RwLock},
    time::{Duration, Instant, SystemTime},
};

use crate::view::View;

use anyhow::{Context as _, Result};
use bytes::Bytes;
use guard_common::{decide, Facts, Kind, LeakAction, Liveness, Mode, Origin, Ownership};
use http_body_util::{combinators::BoxBody, BodyExt as _, Full, StreamBody};
use hyper::{body::Frame, Request, Response, StatusCode};
use serde::Serialize;
use tokio::sync::broadcast;

use crate::{counters::Snapshot, status::Status};

/// One LB IP as the daemon currently treats it.
#[derive(Debug, Clone, Serialize)]
pub struct IpEntry {
    pub state: &'static str,
    /// Which object or line said so.
    pub source: String,
    /// When this state and source were first seen (Unix seconds).
    pub since_unix: u64,
    /// Guarded interfaces that carry the IP themselves.
    pub on_interfaces: Vec<String>,
}

/// What the main loop publishes for the API.
#[derive(Debug, Clone, Default)]
pub struct ApiState {
    pub status: Option<Status>,
    /// Reasons the daemon is not ready (empty: ready).
    pub not_ready: Vec<String>,
    pub ips: BTreeMap<Ipv4Addr, IpEntry>,
    pub mode: Option<Mode>,
    pub leak_action: Option<LeakAction>,
    /// Guarded interface -> has a primary IPv4 to rewrite leaks to.
    pub interfaces: BTreeMap<String, bool>,
    /// The Kubernetes feed: failing since (None: healthy or not used).
    pub feed_failing_since: Option<Instant>,
    pub feed_enabled: bool,
}

/// Operation counters of the daemon itself.
#[derive(Debug, Default)]
pub struct Ops {
    pub feed_events: Mutex<BTreeMap<String, u64>>,
    pub map_writes: AtomicU64,
    pub map_removes: AtomicU64,
    pub errors: Mutex<BTreeMap<&'static str, u64>>,
    /// Kubernetes streams rebuilt (relisted), by stream and reason.
    pub feed_rebuilds: Mutex<BTreeMap<(String, &'static str), u64>>,
}

impl Ops {
    pub fn error(&self, cause: &'static str) {
        *self
            .errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(cause)
            .or_default() += 1;
    }
    pub fn feed_rebuild(&self, stream: &str, reason: &'static str) {
        *self
            .feed_rebuilds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((stream.to_owned(), reason))
            .or_default() += 1;
    }
    pub fn feed_event(&self, source: &str) {
        *self
            .feed_events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(source.to_owned())
            .or_default() += 1;
    }
}

/// The daemon's operation counters (one process, one set).
pub static OPS: std::sync::LazyLock<Ops> = std::sync::LazyLock::new(Ops::default);

/// Everything the API serves from, shared with the main loop.
pub struct Shared {
    pub state: RwLock<ApiState>,
    /// When the main loop last wrote a heartbeat (CLOCK_MONOTONIC ns).
    pub heartbeat_ns: AtomicU64,
    /// Our own COUNTERS and STATS maps, opened again by id for this thread.
    pub maps: Option<(aya::maps::Map, aya::maps::Map)>,
    /// Drop events, one line of JSON each, for `/events` subscribers.
    pub events: broadcast::Sender<String>,
    /// `--metrics-max-ip-series`.
    pub metrics_max_ip_series: usize,
    /// Which counter rows /metrics labels with their IP (see [`crate::metrics::Fold`]).
    pub fold: Mutex<crate::metrics::Fold>,
}

impl Shared {
    pub fn snapshot(&self) -> Result<Snapshot> {
        let (counters, stats) = self.maps.as_ref().context("kernel maps not available")?;
        Snapshot::read(|name| {
            Ok(if name == guard_common::MAP_COUNTERS {
                counters
            } else {
                stats
            })
        })
    }

    /// A cheap read of the STATS map: can the metrics path see the kernel?
    pub fn stats_readable(&self) -> Result<()> {
        let (_, stats) = self.maps.as_ref().context("kernel maps not available")?;
        let stats: aya::maps::PerCpuArray<&aya::maps::MapData, u64> =
            aya::maps::PerCpuArray::try_from(stats)?;
        stats.get(&0, 0).context("reading STATS")?;
        Ok(())
    }

    /// Age of the main loop's last heartbeat (None: none yet).
    pub fn heartbeat_age(&self) -> Option<Duration> {
        let hb = self.heartbeat_ns.load(std::sync::atomic::Ordering::Relaxed);
        (hb != 0).then(|| Duration::from_nanos(crate::datapath::monotonic_ns().saturating_sub(hb)))
    }

    pub fn read(&self) -> std::sync::RwLockReadGuard<'_, ApiState> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    pub fn write(&self) -> std::sync::RwLockWriteGuard<'_, ApiState> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// The per-IP table for the API, keeping `since` for IPs whose state and
/// source did not change.
pub fn ip_entries(
    old: &BTreeMap<Ipv4Addr, IpEntry>,
    view: &View,
    ifnames: &BTreeMap<u32, String>,
) -> BTreeMap<Ipv4Addr, IpEntry> {
    let now = unix_now();
    view.lb
        .iter()
        .map(|(ip, l)| {
            let state = l.state.as_str();
            let source = l.source.to_string();
            let on_interfaces = view
                .if_addrs
                .iter()
                .filter(|(_, a)| a == ip)
                .filter_map(|(i, _)| ifnames.get(i).cloned())
                .collect();
            let since_unix = match old.get(ip) {
                Some(o) if o.state == state && o.source == source => o.since_unix,
                _ => now,
            };
            (
                *ip,
                IpEntry {
                    state,
                    source,
                    since_unix,
                    on_interfaces,
                },
            )
        })
        .collect()
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

type Body = BoxBody<Bytes, Infallible>;

fn text(code: StatusCode, body: impl Into<Bytes>, ctype: &str) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", ctype)
        .body(Full::new(body.into()).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

fn json(code: StatusCode, v: &impl Serialize) -> Response<Body> {
    text(
        code,
        serde_json::to_string_pretty(v).unwrap_or_default() + "\n",
        "application/json",
    )
}

/// Connections served at once; a new one beyond evicts the oldest that is
/// not an event stream (counted).
pub const MAX_CONNECTIONS: usize = 64;
/// A client must send a request's headers within this time, also between
/// requests on a kept-alive connection (slow or idle clients are dropped).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection that is not an event stream is closed after this long.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(60);
/// `/events` subscribers at once.
pub const MAX_EVENT_STREAMS: usize = 16;

/// Serve on `listener` for the life of the daemon. Local clients cannot stop
/// it: headers must come within [`HEADER_TIMEOUT`]; at most
/// [`MAX_CONNECTIONS`] are served at once, and a new one evicts the oldest
/// that is not an event stream (so a crowd of slow clients cannot lock out
/// the kubelet's probes); a failing `accept` (EMFILE when the process is out
/// of file descriptors) is logged and retried with a back-off instead of
/// ending the API.
pub async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "API listening: /metrics /healthz /readyz /status /explain /events /counters");
    }
    struct Conn {
        streaming: Arc<std::sync::atomic::AtomicBool>,
        task: tokio::task::AbortHandle,
    }
    let mut conns: BTreeMap<u64, Conn> = BTreeMap::new();
    let mut next_id = 0u64;
    let mut backoff = Duration::from_millis(10);
    let mut failing = false;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                if failing {
                    tracing::info!("the API accepts connections again");
                    failing = false;
                }
                backoff = Duration::from_millis(10);
                stream
            }
            Err(e) => {
                OPS.error("api_accept");
                if !failing {
                    tracing::warn!(error = %e, "the API cannot accept connections; retrying");
                    failing = true;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        conns.retain(|_, c| !c.task.is_finished());
        if conns.len() >= MAX_CONNECTIONS {
            let oldest = conns
                .iter()
                .find(|(_, c)| !c.streaming.load(std::sync::atomic::Ordering::Relaxed))
                .map(|(id, _)| *id);
            match oldest.and_then(|id| conns.remove(&id)) {
                Some(c) => {
                    OPS.error("api_connection_evicted");
                    c.task.abort();
                }
                None => {
                    OPS.error("api_connection_limit");
                    drop(stream);
                    continue;
                }
            }
        }
        let streaming = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let task = tokio::spawn(serve_connection(stream, shared.clone(), streaming.clone()));
        conns.insert(
            next_id,
            Conn {
                streaming,
                task: task.abort_handle(),
            },
        );
        next_id += 1;
    }
}

/// One client connection, bounded in time unless it becomes an event stream.
async fn serve_connection(
    stream: tokio::net::TcpStream,
    shared: Arc<Shared>,
    streaming: Arc<std::sync::atomic::AtomicBool>,
) {
    let flag = streaming.clone();
    let io = hyper_util::rt::TokioIo::new(stream);
    let svc = hyper::service::service_fn(move |req| {
        let shared = shared.clone();
        let flag = flag.clone();
        async move { Ok::<_, Infallible>(route(req, &shared, &flag)) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(64 * 1024)
        .serve_connection(io, svc);
    tokio::pin!(conn);
    tokio::select! {
        _ = &mut conn => {}
        _ = tokio::time::sleep(CONNECTION_TIMEOUT) => {
            // An event stream lives as long as its reader wants.
            if streaming.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = conn.await;
            }
        }
    }
}

fn route(
    req: Request<hyper::body::Incoming>,
    shared: &Arc<Shared>,
    streaming: &std::sync::atomic::AtomicBool,
) -> Response<Body> {
    if req.method() != hyper::Method::GET && req.method() != hyper::Method::HEAD {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and HEAD\n",
            "text/plain",
        );
        r.headers_mut().insert(
            "allow",
            hyper::header::HeaderValue::from_static("GET, HEAD"),
        );
        return r;
    }
    let path = req.uri().path();
    let query = req.uri().query().unwrap_or("");
    match path {
        // Alive means the main loop still writes heartbeats, not only that
        // this task answers.
        "/healthz" => match shared.heartbeat_age() {
            Some(age) if age < Duration::from_secs(10) => {
                text(StatusCode::OK, "ok\n", "text/plain")
            }
            age => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("main loop stalled: last heartbeat {age:?} ago\n"),
                "text/plain",
            ),
        },
        "/readyz" => {
            let (code, body) = readyz(shared);
            text(code, body, "text/plain")
        }
        "/metrics" => match crate::metrics::render(shared) {
            Ok(body) => text(
                StatusCode::OK,
                body,
                "text/plain; version=0.0.4; charset=utf-8",
            ),
            Err(e) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("{e:#}\n"),
                "text/plain",
            ),
        },
        "/status" => status(shared),
        "/counters" => counters(shared, query),
        "/explain" => {
            let ip = query.split('&').find_map(|kv| kv.strip_prefix("ip="));
            match ip.and_then(|s| s.parse::<Ipv4Addr>().ok()) {
                Some(ip) => json(StatusCode::OK, &explain(shared, ip)),
                None => text(
                    StatusCode::BAD_REQUEST,
                    "use /explain?ip=A.B.C.D\n",
                    "text/plain",
                ),
            }
        }
        "/events" => {
            streaming.store(true, std::sync::atomic::Ordering::Relaxed);
            events(shared)
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics /healthz /readyz /status /explain?ip= /events /counters\n",
            "text/plain",
        ),
    }
}

/// Ready: attached everywhere asked, synced, and `/metrics` can read the
/// kernel counters (metrics that cannot leave every dashboard and alert
/// blind); else 503 with the reasons.
fn readyz(shared: &Shared) -> (StatusCode, String) {
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

/// The kernel counters; with `?interface=NAME`, that interface's rows (404
/// if the guard is not attached there).
fn counters(shared: &Shared, query: &str) -> Response<Body> {
    let iface = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("interface="));
    if let Some(i) = iface {
        if !shared.read().interfaces.contains_key(i) {
            return text(
                StatusCode::NOT_FOUND,
                format!("the guard is not attached to {i}\n"),
                "text/plain",
            );
        }
    }
    match shared.snapshot() {
        Ok(snap) => json(StatusCode::OK, &snap.to_doc().only(iface)),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{e:#}\n"),
            "text/plain",
        ),
    }
}

#[derive(Serialize)]
struct StatusDoc<'a> {
    #[serde(flatten)]
    status: Option<&'a Status>,
    ready: bool,
    not_ready: &'a [String],
    ips: Vec<IpRow<'a>>,
}

#[derive(Serialize)]
struct IpRow<'a> {
    ip: String,
    #[serde(flatten)]
    entry: &'a IpEntry,
    /// Decisions counted for this IP, by verdict.
    counters: BTreeMap<&'static str, u64>,
}

fn status(shared: &Arc<Shared>) -> Response<Body> {
    let snap = shared.snapshot().ok();
    let st = shared.read();
    let ips = st
        .ips
        .iter()
        .map(|(ip, entry)| {
            let mut counters = BTreeMap::new();
            for r in snap
                .iter()
                .flat_map(|s| s.rows.iter())
                .filter(|r| r.key.ip == u32::from(*ip))
            {
                let v = guard_common::Verdict::from_u8(r.key.verdict)
                    .map_or("?", guard_common::Verdict::as_str);
                *counters.entry(v).or_default() += r.value.packets;
            }
            IpRow {
                ip: ip.to_string(),
                entry,
                counters,
            }
        })
        .collect();
    json(
        StatusCode::OK,
        &StatusDoc {
            status: st.status.as_ref(),
            ready: st.not_ready.is_empty(),
            not_ready: &st.not_ready,
            ips,
        },
    )
}

#[derive(Serialize)]
pub struct Explanation {
    pub ip: String,
    /// Whether the IP is in this node's LB set at all.
    pub lb_ip: bool,
    pub state: Option<&'static str>,
    pub source: Option<String>,
    pub known_for_seconds: Option<u64>,
    pub mode: Option<&'static str>,
    pub leak_action: Option<&'static str>,
    pub heartbeat: &'static str,
    /// What the program would do with each kind of frame from each origin,
    /// leaving through each guarded interface.
    pub would: Vec<Would>,
}

#[derive(Serialize)]
pub struct Would {
    pub interface: String,
    pub kind: &'static str,
    pub origin: &'static str,
    pub verdict: &'static str,
}

pub fn explain(shared: &Shared, ip: Ipv4Addr) -> Explanation {
    let st = shared.read();
    let entry = st.ips.get(&ip);
    let (mode, leak_action) = (
        st.mode.unwrap_or(Mode::Enforce),
        st.leak_action.unwrap_or(LeakAction::Rewrite),
    );
    let mut would = Vec::new();
    if let Some(e) = entry {
        let state = Ownership::ALL
            .iter()
            .copied()
            .find(|s| s.as_str() == e.state)
            .unwrap_or(Ownership::Unknown);
        for (iface, has_v4) in &st.interfaces {
            for &kind in Kind::ALL {
                for &origin in Origin::ALL {
                    let verdict = decide(&Facts {
                        kind,
                        origin,
                        state,
                        ip_on_egress: e.on_interfaces.contains(iface),
                        egress_has_ipv4: *has_v4,
                        mode,
                        leak_action,
                        liveness: Liveness::Fresh,
                    });
                    would.push(Would {
                        interface: iface.clone(),
                        kind: kind.as_str(),
                        origin: origin.as_str(),
                        verdict: verdict.as_str(),
                    });
                }
            }
        }
    }
    Explanation {
        ip: ip.to_string(),
        lb_ip: entry.is_some(),
        state: entry.map(|e| e.state),
        source: entry.map(|e| e.source.clone()),
        known_for_seconds: entry.map(|e| unix_now().saturating_sub(e.since_unix)),
        mode: st.mode.map(Mode::as_str),
        leak_action: st.leak_action.map(LeakAction::as_str),
        heartbeat: match shared.heartbeat_age() {
            Some(a) if a < Duration::from_secs(2) => "fresh",
            Some(_) => "late (the main loop is behind; the program judges by its own thresholds)",
            None => "none yet",
        },
        would,
    }
}

/// A live stream of drop events, one JSON object per line.
fn events(shared: &Arc<Shared>) -> Response<Body> {
    if shared.events.receiver_count() >= MAX_EVENT_STREAMS {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("too many event streams (at most {MAX_EVENT_STREAMS})\n"),
            "text/plain",
        );
    }
    let rx = shared.events.subscribe();
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        let line = match rx.recv().await {
            Ok(line) => line + "\n",
            // A slow reader: say how much it missed and go on.
            Err(broadcast::error::RecvError::Lagged(n)) => format!("{{\"lagged\":{n}}}\n"),
            Err(broadcast::error::RecvError::Closed) => return None,
        };
        Some((Ok::<_, Infallible>(Frame::data(Bytes::from(line))), rx))
    });
    Response::builder()
        .header("content-type", "application/x-ndjson")
        .body(StreamBody::new(stream).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

/// A tiny HTTP/1.1 GET for the CLI: (status code, body). `stream` prints the
/// body as it arrives instead (for `/events`).
pub fn get(
    addr: SocketAddr,
    path: &str,
    stream: Option<&mut dyn FnMut(&str)>,
) -> Result<(u16, String)> {
    use std::io::{BufRead as _, BufReader, Read as _, Write as _};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).with_context(|| {
        format!("no arp-guard daemon answers on {addr}: is it running, and with this --listen address (--api)?")
    })?;
    // A stuck daemon must not hang the CLI (the event stream waits as long as it takes).
    if stream.is_none() {
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
    }
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let code: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("bad HTTP answer")?;
    let mut chunked = false;
    loop {
        let mut h = String::new();
        r.read_line(&mut h)?;
        if h.trim().is_empty() {
            break;
        }
        if h.to_ascii_lowercase().starts_with("transfer-encoding:")
            && h.to_ascii_lowercase().contains("chunked")
        {
            chunked = true;
        }
    }
    let mut body = String::new();
    if chunked {
        let mut sink = stream;
        loop {
            let mut size = String::new();
            if r.read_line(&mut size)? == 0 {
                break;
            }
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            let mut buf = vec![0; n + 2];
            r.read_exact(&mut buf)?;
            let piece = String::from_utf8_lossy(&buf[..n]).into_owned();
            match sink.as_mut() {
                Some(f) => f(&piece),
                None => body.push_str(&piece),
            }
        }
    } else {
        r.read_to_string(&mut body)?;
    }
    Ok((code, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(maps: Option<(aya::maps::Map, aya::maps::Map)>) -> Shared {
        Shared {
            state: Default::default(),
            heartbeat_ns: AtomicU64::new(1),
            maps,
            events: broadcast::channel(1).0,
            metrics_max_ip_series: 10,
            fold: Default::default(),
        }
    }

    /// A metrics path that cannot read the kernel is not ready: every
    /// dashboard and alert would be blind.
    #[test]
    fn not_ready_when_metrics_cannot_read_the_kernel() {
        let s = shared(None);
        let (code, body) = readyz(&s);
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            body.contains("/metrics cannot read the kernel counters"),
            "{body}"
        );
        s.write().not_ready.push("attached to no interface".into());
        let (_, body) = readyz(&s);
        assert!(
            body.contains("attached to no interface") && body.contains("/metrics"),
            "{body}"
        );
    }
}
