//! The daemon's local HTTP API: `/metrics` (Prometheus text), `/healthz`,
//! `/readyz`, `/status`, `/explain?ip=`, `/counters`, `/events`. It listens
//! on `--listen` (loopback by default: exposing it off the host is a
//! deliberate choice); `--metrics-listen` serves `/metrics` alone, for a
//! Prometheus that scrapes the node's address. `arp-guard status|explain|events|counters` are
//! clients of it (`client`), reading the documents of `types`.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use crate::ops::{ErrorCause, Ops};

pub mod client;
pub mod cluster;
pub mod routes;
pub mod state;
pub mod types;

pub use state::Shared;

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
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    paths: &'static str,
    ops: Arc<Ops>,
) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, paths, "API listening");
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
                ops.error(ErrorCause::ApiAccept);
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
                    ops.error(ErrorCause::ApiConnectionEvicted);
                    c.task.abort();
                }
                None => {
                    ops.error(ErrorCause::ApiConnectionLimit);
                    drop(stream);
                    continue;
                }
            }
        }
        let streaming = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let task = tokio::spawn(serve_connection(stream, router.clone(), streaming.clone()));
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
    router: axum::Router,
    streaming: Arc<std::sync::atomic::AtomicBool>,
) {
    use tower::ServiceExt as _;
    let flag = routes::Streaming(streaming.clone());
    let io = hyper_util::rt::TokioIo::new(stream);
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(flag.clone());
        router.clone().oneshot(req)
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

#[cfg(test)]
mod tests {
    use super::{routes::readyz, state::Shared};
    use axum::http::StatusCode;

    fn shared(maps: Option<(aya::maps::Map, aya::maps::Map)>) -> Shared {
        Shared::new(maps, 10, Default::default())
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
