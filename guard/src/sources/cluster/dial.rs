//! The connection a watch is read from: opened by the feed itself rather
//! than taken from kube's pooled client, so that the stream's own task
//! drives it (no connection task, no channel between the socket and the
//! parser). The HTTP/1.1 is hyper's client connection
//! (`hyper::client::conn::http1`), whose [`Connection`] future is polled
//! by whoever awaits the response or its body ([`Link::drive`]).
//!
//! Everything that makes it the cluster's client is kube's or client-go's:
//! the request passes through kube's own layers (base URI, credentials with
//! their refresh, extra and impersonation headers); TLS is kube's rustls
//! configuration (CA, client certificate, server name) with ALPN pinned to
//! `http/1.1`; the TCP connection is the one every request of the guard
//! takes (`guard_wire::route`: the proxy kubectl would take, with its
//! credentials; happy eyeballs; keepalive probes, so that a peer that
//! vanished without a FIN is noticed without a request). After a watch the
//! server ended cleanly the connection is kept for the next one, as a
//! pooled client would.

use std::{
    future::Future,
    pin::{pin, Pin},
    sync::Arc,
    task::Context,
    time::Duration,
};

use bytes::Bytes;
use guard_wire::route::Route;
use http::{header, HeaderValue, Request, Response};
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::{
    body::Incoming,
    client::conn::http1::{self, Connection, SendRequest},
};
use hyper_util::rt::TokioIo;
use kube::client::{Body, ConfigExt as _};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tower::{util::BoxCloneSyncService, BoxError, ServiceBuilder, ServiceExt as _};

/// Longest error body read (a Status object is a few hundred bytes).
const MAX_ERROR_BODY: usize = 64 << 10;
/// A kept connection must answer a new watch's head within this, else a
/// fresh one is opened (the API server writes a watch's head at once; a
/// kept connection that died without a FIN or RST would otherwise hold the
/// watch until the stream's idle deadline).
const REUSED_HEAD: Duration = Duration::from_secs(5);
pub use guard_wire::route::KEEPALIVE_DEAD;

/// A connection to the API server, plain or TLS, through a proxy or not.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}
pub type Conn = Box<dyn Io>;

type H1 = Connection<TokioIo<Conn>, Empty<Bytes>>;

/// One HTTP/1.1 connection: what sends requests on it, and the connection
/// future, which does nothing unless polled. Whoever awaits a response or
/// reads a body on it polls it too ([`Link::drive`]): it is the stream's own
/// task that reads the socket.
pub struct Link {
    send: SendRequest<Empty<Bytes>>,
    /// None once it ended (closed by either side, or failed: the body, or
    /// the response being awaited, gets the error).
    conn: Option<H1>,
}

impl Link {
    /// Poll the connection (read, write, keep-alive bookkeeping); it stays
    /// registered with the socket for the next wake-up.
    pub fn poll_conn(&mut self, cx: &mut Context<'_>) {
        if let Some(c) = self.conn.as_mut() {
            if Pin::new(c).poll(cx).is_ready() {
                self.conn = None;
            }
        }
    }

    /// Await `f` (a response, a body frame) while driving the connection.
    pub async fn drive<F: Future>(&mut self, f: F) -> F::Output {
        let mut f = pin!(f);
        std::future::poll_fn(|cx| {
            self.poll_conn(cx);
            f.as_mut().poll(cx)
        })
        .await
    }

    /// Ready for another request: the last response was read to its end
    /// and neither side closed the connection.
    async fn ready(&mut self) -> hyper::Result<()> {
        std::future::poll_fn(|cx| {
            self.poll_conn(cx);
            self.send.poll_ready(cx)
        })
        .await
    }

    /// Send `req`, the response's head once it arrives (hyper skips 1xx).
    async fn request(&mut self, req: Request<Empty<Bytes>>) -> hyper::Result<Response<Incoming>> {
        let answer = self.send.send_request(req);
        self.drive(answer).await
    }

    /// Whether a later request may use it: it has not ended, and hyper
    /// would send on it (the body it carried was read to its end and the
    /// server keeps it).
    pub fn reusable(&self) -> bool {
        self.conn.is_some() && !self.send.is_closed()
    }
}

/// A request as kube's layers left it (a GET: no body).
#[derive(Clone)]
struct Prepared {
    method: http::Method,
    uri: http::Uri,
    headers: http::HeaderMap,
}

impl Prepared {
    /// As hyper sends it: the origin-form target, a Host and a User-Agent
    /// if kube's layers set none.
    fn request(&self) -> Result<Request<Empty<Bytes>>, http::Error> {
        let target = self.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut req = Request::builder()
            .method(self.method.clone())
            .uri(target)
            .body(Empty::new())?;
        *req.headers_mut() = self.headers.clone();
        let h = req.headers_mut();
        if !h.contains_key(header::HOST) {
            let host = self.uri.authority().map_or("", |a| a.as_str());
            h.insert(header::HOST, HeaderValue::from_str(host)?);
        }
        if !h.contains_key(header::USER_AGENT) {
            h.insert(
                header::USER_AGENT,
                HeaderValue::from_static(concat!("arp-guard/", env!("CARGO_PKG_VERSION"))),
            );
        }
        Ok(req)
    }
}

/// Opens the feed's watch connections as kube's client would.
#[derive(Clone)]
pub struct Dialer {
    /// kube's request layers. They wrap a service that answers with a
    /// response, so the innermost one answers with an empty response that
    /// carries the prepared request ([`Prepared`]) in its extensions.
    prepare: BoxCloneSyncService<Request<Body>, http::Response<()>, BoxError>,
    route: Route,
    tls: Option<tokio_rustls::TlsConnector>,
    /// `tls-server-name` of the kubeconfig, else the URL's host.
    server_name: Option<ServerName<'static>>,
    connect_timeout: Option<Duration>,
}

fn io_error(e: impl Into<BoxError>) -> kube::Error {
    kube::Error::Service(e.into())
}

impl Dialer {
    pub fn new(config: &kube::Config) -> kube::Result<Dialer> {
        let prepare = ServiceBuilder::new()
            .layer(config.base_uri_layer())
            .option_layer(config.auth_layer()?)
            .layer(config.extra_headers_layer()?)
            .service_fn(|r: Request<Body>| async move {
                let (parts, _) = r.into_parts();
                let mut answer = http::Response::new(());
                answer.extensions_mut().insert(Prepared {
                    method: parts.method,
                    uri: parts.uri,
                    headers: parts.headers,
                });
                Ok::<_, BoxError>(answer)
            });
        let https = config.cluster_url.scheme() == Some(&http::uri::Scheme::HTTPS);
        let tls = https
            .then(|| {
                config.rustls_client_config().map(|mut c| {
                    // The watch is read as HTTP/1.1: the server must not
                    // choose another protocol, whatever kube's defaults
                    // offer one day.
                    c.alpn_protocols = vec![b"http/1.1".to_vec()];
                    Arc::new(c)
                })
            })
            .transpose()?
            .map(tokio_rustls::TlsConnector::from);
        let server_name = (config.tls_server_name.clone())
            .map(|n| ServerName::try_from(n).map_err(io_error))
            .transpose()?;
        Ok(Dialer {
            prepare: BoxCloneSyncService::new(prepare),
            route: Route::new(config.proxy_url.as_ref(), config.connect_timeout)
                .map_err(io_error)?,
            tls,
            server_name,
            connect_timeout: config.connect_timeout,
        })
    }

    /// Send `req` (a GET) on `reuse`, the connection of the last watch, or
    /// on a new one: the response once its head says success, else the
    /// API's error. A kept connection that cannot take the request, or
    /// gives no answer, is replaced once.
    pub async fn send(
        &self,
        req: Request<Vec<u8>>,
        reuse: Option<Link>,
    ) -> kube::Result<(Response<Incoming>, Link)> {
        let prepared = (self.prepare.clone().oneshot(req.map(Body::from)).await).map_err(|e| {
            e.downcast::<kube::Error>()
                .map_or_else(kube::Error::Service, |e| *e)
        })?;
        let Some(req) = prepared.extensions().get::<Prepared>() else {
            return Err(io_error("kube's request layers lost the request"));
        };
        if let Some(mut link) = reuse {
            // Not ready, closed, reset, silent: a fresh connection; an
            // answer, even an error, is the answer.
            let asked = async {
                link.ready().await.ok()?;
                link.request(req.request().ok()?).await.ok()
            };
            if let Ok(Some(resp)) = tokio::time::timeout(REUSED_HEAD, asked).await {
                return answer(resp, link).await;
            }
        }
        let mut link = self.connect(&req.uri).await?;
        let r = req.request().map_err(kube::Error::HttpError)?;
        match link.request(r).await {
            Ok(resp) => answer(resp, link).await,
            Err(e) => Err(kube::Error::HyperError(e)),
        }
    }

    /// A new connection, TCP (and the proxy's handshake) and TLS all within
    /// the configured connect timeout (as kube's connector bounds them).
    async fn connect(&self, uri: &http::Uri) -> kube::Result<Link> {
        let open = self.open(uri);
        let io = match self.connect_timeout {
            Some(t) => tokio::time::timeout(t, open).await.map_err(|_| {
                io_error(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "connecting to {}: no answer within {t:?}",
                        uri.authority().map_or("", |a| a.as_str())
                    ),
                ))
            })??,
            None => open.await?,
        };
        let (send, conn) = http1::Builder::new()
            .handshake(TokioIo::new(io))
            .await
            .map_err(kube::Error::HyperError)?;
        Ok(Link {
            send,
            conn: Some(conn),
        })
    }

    async fn open(&self, uri: &http::Uri) -> kube::Result<Conn> {
        let tcp = self
            .route
            .connect(uri.clone())
            .await
            .map_err(kube::Error::Service)?;
        let Some(tls) = &self.tls else {
            return Ok(Box::new(tcp));
        };
        let name = match &self.server_name {
            Some(n) => n.clone(),
            None => {
                let host = uri.host().unwrap_or_default();
                // An IPv6 literal is bracketed in the URL, not in a name.
                let host = host.trim_start_matches('[').trim_end_matches(']');
                ServerName::try_from(host.to_owned()).map_err(io_error)?
            }
        };
        let s = tls.connect(name, tcp).await.map_err(io_error)?;
        Ok(Box::new(s))
    }
}

/// A success as it is; an error status read into the API's error, as
/// kube's client reports it (a Status object, else the body's text); a 429
/// or 503's `Retry-After` kept in the Status's details, for the back-off.
async fn answer(
    resp: Response<Incoming>,
    mut link: Link,
) -> kube::Result<(Response<Incoming>, Link)> {
    let code = resp.status().as_u16();
    if resp.status().is_success() {
        return Ok((resp, link));
    }
    let retry_after = (resp.headers().get(header::RETRY_AFTER))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u32>().ok());
    let body = link
        .drive(Limited::new(resp.into_body(), MAX_ERROR_BODY).collect())
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body);
    let mut status = match serde_json::from_str::<kube::core::Status>(&text) {
        Ok(s) if s.code != 0 => s,
        Ok(s) => s.with_code(code),
        Err(_) => {
            kube::core::Status::failure(text.trim(), "Failed to parse error data").with_code(code)
        }
    };
    if let Some(secs) = retry_after {
        match status.details.as_mut() {
            Some(d) if d.retry_after_seconds == 0 => d.retry_after_seconds = secs,
            Some(_) => {}
            None => {
                // Every field of StatusDetails has a default in its schema.
                let empty = serde_json::from_str::<kube::core::response::StatusDetails>("{}");
                status.details = empty.ok().map(|mut d| {
                    d.retry_after_seconds = secs;
                    d
                });
            }
        }
    }
    Err(kube::Error::Api(status.boxed()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_carries_kube_s_headers_a_host_and_an_origin_form_target() {
        let mut headers = http::HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        let p = Prepared {
            method: http::Method::GET,
            uri: "https://203.0.113.1:6443/api/v1/services?watch=true"
                .parse()
                .unwrap(),
            headers,
        };
        let r = p.request().unwrap();
        assert_eq!(r.uri(), "/api/v1/services?watch=true");
        assert_eq!(r.headers()[header::HOST], "203.0.113.1:6443");
        assert_eq!(r.headers()[header::AUTHORIZATION], "Bearer t");
        assert!(r.headers()[header::USER_AGENT]
            .to_str()
            .unwrap()
            .starts_with("arp-guard/"));
    }
}
