//! The TCP connection to the API server, for every request the guard and
//! `kubectl arp-guard` make (kube's client, `kubeconfig::client`, and the
//! guard's own watch connections): directly, or through the proxy kubectl
//! would take (`kubeconfig::settle_proxy`), as HTTP CONNECT (hyper-util's
//! [`Tunnel`], Basic credentials from the URL) or SOCKS5 (hyper-util's
//! [`SocksV5`], user and password from the URL, the name resolved by the
//! proxy as Go's dialer has it). kube-rs's own connector passes no SOCKS5
//! credentials; client-go does, hence this one.
//!
//! The socket is hyper-util's [`HttpConnector`]'s: every address of the
//! name, IPv6 and IPv4 raced as happy eyeballs, each attempt within its
//! share of the connect timeout; no delay on small writes; TCP keepalive
//! probes on a connection silent for [`KEEPALIVE_IDLE`], so that a peer
//! that vanished without a FIN is noticed by the kernel within
//! [`KEEPALIVE_DEAD`], with no request.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use http::{HeaderValue, Uri};
use hyper_util::{
    client::legacy::connect::{
        proxy::{SocksV5, Tunnel},
        HttpConnector,
    },
    rt::TokioIo,
};
use tower::{BoxError, Service, ServiceExt as _};

/// The first keepalive probe after this much silence...
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
/// ...then one every this long...
const KEEPALIVE_EVERY: Duration = Duration::from_secs(2);
/// ...and the connection is dead after this many unanswered.
const KEEPALIVE_PROBES: u32 = 3;
/// The longest a dead peer goes unnoticed on an idle connection (also the
/// TCP user timeout: data unacknowledged this long ends the connection).
pub const KEEPALIVE_DEAD: Duration = Duration::from_secs(
    KEEPALIVE_IDLE.as_secs() + KEEPALIVE_EVERY.as_secs() * KEEPALIVE_PROBES as u64,
);

/// How TCP reaches the API server: directly, or through the proxy.
#[derive(Clone)]
pub enum Route {
    Direct(HttpConnector),
    Tunnel(Tunnel<HttpConnector>),
    Socks(SocksV5<HttpConnector>),
}

/// A proxy URL of a kind neither client speaks.
#[derive(Debug, thiserror::Error)]
#[error("the proxy {0} is not http:// (HTTP CONNECT) or socks5://")]
pub struct UnknownProxy(pub String);

impl Route {
    /// To the API server through `proxy` (settled as kubectl would), or
    /// directly; each connection attempt within `connect_timeout`.
    pub fn new(
        proxy: Option<&Uri>,
        connect_timeout: Option<Duration>,
    ) -> Result<Route, UnknownProxy> {
        let mut tcp = HttpConnector::new();
        // The scheme is TLS's business, not the socket's.
        tcp.enforce_http(false);
        // A watch event is one small write: sent at once.
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(connect_timeout);
        tcp.set_keepalive(Some(KEEPALIVE_IDLE));
        tcp.set_keepalive_interval(Some(KEEPALIVE_EVERY));
        tcp.set_keepalive_retries(Some(KEEPALIVE_PROBES));
        tcp.set_tcp_user_timeout(Some(KEEPALIVE_DEAD));
        let Some(proxy) = proxy else {
            return Ok(Route::Direct(tcp));
        };
        let creds = credentials(proxy);
        match proxy.scheme_str() {
            Some("http") => {
                let mut t = Tunnel::new(proxy.clone(), tcp);
                if let Some(basic) =
                    creds.and_then(|(u, p)| HeaderValue::from_str(&basic_auth(&u, &p)).ok())
                {
                    t = t.with_auth(basic);
                }
                Ok(Route::Tunnel(t))
            }
            Some("socks5") => {
                let mut s = SocksV5::new(proxy.clone(), tcp).local_dns(false);
                if let Some((user, pass)) = creds {
                    s = s.with_auth(user, pass);
                }
                Ok(Route::Socks(s))
            }
            _ => Err(UnknownProxy(crate::connect::without_credentials(
                &proxy.to_string(),
            ))),
        }
    }

    /// A TCP connection to `dst`, through the proxy if there is one.
    pub async fn connect(&self, dst: Uri) -> Result<tokio::net::TcpStream, BoxError> {
        Ok(match self {
            Route::Direct(c) => c.clone().oneshot(dst).await?.into_inner(),
            Route::Tunnel(c) => c.clone().oneshot(dst).await?.into_inner(),
            Route::Socks(c) => c.clone().oneshot(dst).await?.into_inner(),
        })
    }
}

/// A connector for hyper's pooled client (kube's): the route's socket.
impl Service<Uri> for Route {
    type Response = TokioIo<tokio::net::TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let route = self.clone();
        Box::pin(async move { route.connect(dst).await.map(TokioIo::new) })
    }
}

/// The user and password of a proxy URL (`http://user:pa%40ss@proxy:3128`),
/// percent-decoded as Go's `url.Parse` has them.
pub fn credentials(proxy: &Uri) -> Option<(String, String)> {
    let (userinfo, _) = proxy.authority()?.as_str().rsplit_once('@')?;
    let (user, pass) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    Some((decode(user), decode(pass)))
}

/// A `Proxy-Authorization` value.
fn basic_auth(user: &str, pass: &str) -> String {
    use base64::Engine as _;
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
    format!("Basic {token}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The proxy's credentials as Go's URL parser has them: percent-decoded,
    /// a password with `@` and `:` in it, a user alone.
    #[test]
    fn proxy_credentials_are_decoded_from_the_url() {
        let u = |s: &str| credentials(&s.parse().unwrap());
        assert_eq!(u("http://198.51.100.9:3128"), None);
        assert_eq!(
            u("http://al%40ice:p%40ss%3Aword@198.51.100.9:3128"),
            Some(("al@ice".into(), "p@ss:word".into()))
        );
        assert_eq!(
            u("socks5://bob@198.51.100.9:1080"),
            Some(("bob".into(), String::new()))
        );
        assert_eq!(
            basic_auth("al@ice", "p@ss:word"),
            "Basic YWxAaWNlOnBAc3M6d29yZA=="
        );
    }

    /// A proxy neither client speaks is refused, not bypassed; its
    /// credentials are not in the error.
    #[test]
    fn an_unknown_proxy_is_refused_not_bypassed() {
        let p: Uri = "https://u:secret@203.0.113.9:3128".parse().unwrap();
        let e = Route::new(Some(&p), None).err().unwrap().to_string();
        assert!(e.contains("203.0.113.9") && !e.contains("secret"), "{e}");
        let s: Uri = "socks5://203.0.113.9:1080".parse().unwrap();
        assert!(Route::new(Some(&s), None).is_ok());
    }
}
