//! The connection a watch is read from: opened by the feed itself rather
//! than by kube's pooled client, so that the stream's own task reads the
//! socket (see `http1`). Everything that makes it the cluster's client is
//! kube's: the request passes through kube's own layers (base URI, the
//! credentials with their refresh, extra and impersonation headers) and TLS
//! is kube's rustls configuration (CA, client certificate, server name).
//! After a watch the server ended cleanly the connection is kept for the
//! next one, as a pooled client would.

use std::{sync::Arc, time::Duration};

use http::{header, Request};
use kube::client::{Body, ConfigExt as _};
use rustls::pki_types::ServerName;
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _},
    net::TcpStream,
};
use tower::{util::BoxCloneSyncService, BoxError, ServiceBuilder, ServiceExt as _};

use super::http1::{self, Framing, Head};

/// Longest error body read (a Status object is a few hundred bytes).
const MAX_ERROR_BODY: usize = 64 << 10;
/// Bytes read from the socket at a time.
pub const READ_BUF: usize = 32 << 10;
/// A kept connection must answer a new watch's head within this, else a
/// fresh one is opened (the API server writes a watch's head at once; a
/// kept connection that died without a FIN or RST would otherwise hold the
/// watch until the stream's idle timeout).
const REUSED_HEAD: Duration = Duration::from_secs(5);

/// A connection to the API server, plain or TLS.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}
pub type Conn = Box<dyn Io>;

/// A response whose head says success, ready for its body.
pub struct Opened {
    pub head: Head,
    pub conn: Conn,
    /// Body bytes read together with the head.
    pub rest: Vec<u8>,
}

/// A request as kube's layers left it (a GET: no body).
#[derive(Clone)]
struct Prepared {
    method: http::Method,
    uri: http::Uri,
    headers: http::HeaderMap,
}

/// Opens the feed's watch connections as kube's client would.
#[derive(Clone)]
pub struct Dialer {
    /// kube's request layers. They wrap a service that answers with a
    /// response, so the innermost one answers with an empty response that
    /// carries the prepared request ([`Prepared`]) in its extensions.
    prepare: BoxCloneSyncService<Request<Body>, http::Response<()>, BoxError>,
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
        // The configuration is settled first (`no_proxy.rs`: a proxy kubectl
        // would use is an error there); said here as well, so that the
        // watches can never go around a proxy the client would take.
        if let Some(proxy) = &config.proxy_url {
            return Err(io_error(format!(
                "a proxy ({proxy}) is configured; the guard's watches connect to the API server directly \
                 and do not support one"
            )));
        }
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
            .then(|| config.rustls_client_config().map(Arc::new))
            .transpose()?
            .map(tokio_rustls::TlsConnector::from);
        let server_name = (config.tls_server_name.clone())
            .map(|n| ServerName::try_from(n).map_err(io_error))
            .transpose()?;
        Ok(Dialer {
            prepare: BoxCloneSyncService::new(prepare),
            tls,
            server_name,
            connect_timeout: config.connect_timeout,
        })
    }

    /// Send `req` (a GET) on `reuse`, the connection of the last watch, or
    /// on a new one: the response's head once it says success, else the
    /// API's error. A kept connection the server has closed meanwhile is
    /// replaced once.
    pub async fn send(&self, req: Request<Vec<u8>>, reuse: Option<Conn>) -> kube::Result<Opened> {
        let prepared = (self.prepare.clone().oneshot(req.map(Body::from)).await).map_err(|e| {
            e.downcast::<kube::Error>()
                .map_or_else(kube::Error::Service, |e| *e)
        })?;
        let Some(req) = prepared.extensions().get::<Prepared>() else {
            return Err(io_error("kube's request layers lost the request"));
        };
        let bytes = request_bytes(req);
        if let Some(conn) = reuse {
            // Nothing back (closed, reset, silent): a fresh connection; an
            // answer, even an error, is the answer.
            if let Ok(Ok(Some(o))) = tokio::time::timeout(REUSED_HEAD, exchange(conn, &bytes)).await
            {
                return answer(o).await;
            }
        }
        let conn = self.connect(&req.uri).await?;
        match exchange(conn, &bytes).await {
            Ok(Some(o)) => answer(o).await,
            Ok(None) => Err(io_error(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the API server closed the connection before answering",
            ))),
            Err(e) => Err(e),
        }
    }

    /// A new connection, TCP and TLS both within the configured connect
    /// timeout (as kube's connector bounds them).
    async fn connect(&self, uri: &http::Uri) -> kube::Result<Conn> {
        let host = uri.host().unwrap_or_default();
        // An IPv6 literal is bracketed in the URL, not in an address.
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = uri
            .port_u16()
            .unwrap_or(if self.tls.is_some() { 443 } else { 80 });
        let open = self.open(host, port);
        match self.connect_timeout {
            Some(t) => tokio::time::timeout(t, open).await.map_err(|_| {
                io_error(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("connecting to {host}:{port}: no answer within {t:?}"),
                ))
            })?,
            None => open.await,
        }
    }

    async fn open(&self, host: &str, port: u16) -> kube::Result<Conn> {
        let tcp = TcpStream::connect((host, port)).await.map_err(io_error)?;
        // A watch event is one small write: sent at once.
        tcp.set_nodelay(true).map_err(io_error)?;
        let Some(tls) = &self.tls else {
            return Ok(Box::new(tcp));
        };
        let name = match &self.server_name {
            Some(n) => n.clone(),
            None => ServerName::try_from(host.to_owned()).map_err(io_error)?,
        };
        let s = tls.connect(name, tcp).await.map_err(io_error)?;
        Ok(Box::new(s))
    }
}

/// The request as HTTP/1.1 bytes (a GET: no body).
fn request_bytes(req: &Prepared) -> Vec<u8> {
    let uri = &req.uri;
    let target = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(format!("{} {target} HTTP/1.1\r\n", req.method).as_bytes());
    if !req.headers.contains_key(header::HOST) {
        let host = uri.authority().map_or("", |a| a.as_str());
        out.extend_from_slice(format!("host: {host}\r\n").as_bytes());
    }
    if !req.headers.contains_key(header::USER_AGENT) {
        out.extend_from_slice(
            concat!("user-agent: arp-guard/", env!("CARGO_PKG_VERSION"), "\r\n").as_bytes(),
        );
    }
    for (k, v) in &req.headers {
        out.extend_from_slice(k.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Write the request and read the head: None when the connection ended
/// before any byte of an answer. A write or read that fails is the error
/// (a TLS alert, a reset: the cause the feed reports).
async fn exchange(mut conn: Conn, req: &[u8]) -> kube::Result<Option<Opened>> {
    conn.write_all(req).await.map_err(io_error)?;
    conn.flush().await.map_err(io_error)?;
    let mut buf = Vec::with_capacity(READ_BUF);
    loop {
        let at = buf.len();
        buf.resize(at + READ_BUF.min(http1::MAX_HEAD + 1 - at).max(1), 0);
        let n = conn.read(&mut buf[at..]).await.map_err(io_error)?;
        buf.truncate(at + n);
        if n == 0 {
            if at == 0 {
                return Ok(None);
            }
            return Err(io_error(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the API server closed the connection inside a response head",
            )));
        }
        if let Some((head, len)) =
            http1::head(&buf).map_err(|e| io_error(std::io::Error::from(e)))?
        {
            let rest = buf.split_off(len);
            return Ok(Some(Opened { head, conn, rest }));
        }
    }
}

/// A success as it is; an error status read into the API's error, as
/// kube's client reports it (a Status object, else the body's text).
async fn answer(o: Opened) -> kube::Result<Opened> {
    let code = o.head.status;
    if (200..300).contains(&code) {
        return Ok(o);
    }
    let body = error_body(o).await;
    let text = String::from_utf8_lossy(&body);
    let status = match serde_json::from_str::<kube::core::Status>(&text) {
        Ok(s) if s.code != 0 => s,
        Ok(s) => s.with_code(code),
        Err(_) => {
            kube::core::Status::failure(text.trim(), "Failed to parse error data").with_code(code)
        }
    };
    Err(kube::Error::Api(status.boxed()))
}

/// An error response's body, at most [`MAX_ERROR_BODY`] bytes of it, read
/// for as long as it takes the server to send it (the caller's deadline
/// bounds the time).
async fn error_body(o: Opened) -> Vec<u8> {
    let Opened {
        head,
        mut conn,
        rest,
    } = o;
    let mut body = http1::Body::new(head.framing);
    let mut out = Vec::new();
    let mut input = rest;
    let mut buf = vec![0; 4096];
    loop {
        let mut at = 0;
        loop {
            let Ok((n, piece)) = body.next(&input[at..]) else {
                return out;
            };
            at += n;
            match piece {
                http1::Piece::Data(n) => {
                    let take = n.min(MAX_ERROR_BODY - out.len());
                    out.extend_from_slice(&input[at..at + take]);
                    body.take(n);
                    at += n;
                    if out.len() >= MAX_ERROR_BODY {
                        return out;
                    }
                }
                http1::Piece::More => break,
                http1::Piece::End => return out,
            }
        }
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return out,
            Ok(n) => input = buf[..n].to_vec(),
        }
        if head.framing == Framing::Close && out.len() >= MAX_ERROR_BODY {
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_carries_kube_s_headers_and_a_host() {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            http::HeaderValue::from_static("Bearer t"),
        );
        headers.insert(
            header::ACCEPT_ENCODING,
            http::HeaderValue::from_static("identity"),
        );
        let req = Prepared {
            method: http::Method::GET,
            uri: "https://203.0.113.1:6443/api/v1/services?watch=true"
                .parse()
                .unwrap(),
            headers,
        };
        let text = String::from_utf8(request_bytes(&req)).unwrap();
        assert!(
            text.starts_with("GET /api/v1/services?watch=true HTTP/1.1\r\n"),
            "{text}"
        );
        assert!(text.contains("host: 203.0.113.1:6443\r\n"), "{text}");
        assert!(text.contains("authorization: Bearer t\r\n"), "{text}");
        assert!(text.contains("user-agent: arp-guard/"), "{text}");
        assert!(text.ends_with("\r\n\r\n"), "{text}");
    }

    /// A server's bytes after the request, as a connection.
    fn conn(reply: &'static [u8]) -> Conn {
        let (client, mut server) = tokio::io::duplex(1 << 20);
        tokio::spawn(async move {
            let mut req = [0u8; 1024];
            let _ = server.read(&mut req).await;
            let _ = server.write_all(reply).await;
        });
        Box::new(client)
    }

    #[tokio::test]
    async fn an_error_status_is_the_api_s_error() {
        let gone = b"HTTP/1.1 410 Gone\r\nTransfer-Encoding: chunked\r\n\r\n\
            2c\r\n{\"kind\":\"Status\",\"code\":410,\"message\":\"old\"}\r\n0\r\n\r\n";
        let o = exchange(conn(gone), b"GET / HTTP/1.1\r\n\r\n")
            .await
            .unwrap()
            .unwrap();
        match answer(o).await {
            Err(kube::Error::Api(s)) => assert_eq!((s.code, s.message.as_str()), (410, "old")),
            _ => panic!("a 410 is the API's error"),
        }
        let html = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 11\r\n\r\n<html>x</h>";
        let o = exchange(conn(html), b"GET / HTTP/1.1\r\n\r\n")
            .await
            .unwrap()
            .unwrap();
        match answer(o).await {
            Err(kube::Error::Api(s)) => {
                assert_eq!((s.code, s.message.as_str()), (502, "<html>x</h>"))
            }
            _ => panic!("a 502 is the API's error"),
        }
    }

    #[tokio::test]
    async fn a_closed_kept_connection_is_nothing_not_an_error() {
        assert!(exchange(conn(b""), b"GET / HTTP/1.1\r\n\r\n")
            .await
            .unwrap()
            .is_none());
        let cut = exchange(conn(b"HTTP/1.1 200 OK\r\nConte"), b"GET / HTTP/1.1\r\n\r\n").await;
        assert!(cut.is_err(), "a head cut short is an error");
    }

    /// A server on loopback that answers each connection's first request
    /// with `reply`; counts the connections.
    async fn server(
        reply: &'static [u8],
    ) -> (kube::Config, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let c = count.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut req = [0u8; 4096];
                    let _ = s.read(&mut req).await;
                    let _ = s.write_all(reply).await;
                });
            }
        });
        (kube::Config::new(url.parse().unwrap()), count)
    }

    fn get() -> Request<Vec<u8>> {
        Request::get("/api/v1/services?watch=true")
            .body(Vec::new())
            .unwrap()
    }

    /// A kept connection the server closed, or one that went silent, costs
    /// one fresh connection, not a failed watch nor the stream's idle
    /// timeout; a fresh connection's error is the error.
    #[tokio::test]
    async fn a_dead_kept_connection_is_replaced_by_a_fresh_one() {
        let (config, count) =
            server(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").await;
        let d = Dialer::new(&config).unwrap();
        let closed = conn(b"");
        let o = d.send(get(), Some(closed)).await.unwrap();
        assert_eq!((o.head.status, o.head.framing), (200, Framing::Chunked));
        assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Silent: the kept connection never answers.
        let (silent, _held) = tokio::io::duplex(1 << 16);
        let t = std::time::Instant::now();
        d.send(get(), Some(Box::new(silent))).await.unwrap();
        assert!(
            t.elapsed() < REUSED_HEAD + Duration::from_secs(2),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 2);
        // A server that closes a fresh connection at once: an error.
        let (config, _) = server(b"").await;
        let e = Dialer::new(&config).unwrap().send(get(), None).await;
        assert!(e.is_err());
    }

    #[test]
    fn a_configured_proxy_is_refused_not_bypassed() {
        let mut c = kube::Config::new("https://203.0.113.1:6443".parse().unwrap());
        c.proxy_url = Some("http://203.0.113.9:3128".parse().unwrap());
        let e = Dialer::new(&c).err().unwrap();
        assert!(e.to_string().contains("proxy"), "{e}");
    }
}
