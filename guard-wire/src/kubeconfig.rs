//! The client's configuration, read as kubectl reads it, for the guard and
//! `kubectl arp-guard` alike: `--kubeconfig`, else `$KUBECONFIG` (a list,
//! merged), else `~/.kube/config`, else the Pod's service account; the
//! context asked for, else the current one; the proxy kubectl would take
//! ([`settle_proxy`], with `connect::kubectl_proxy`'s rules) and the TLS
//! roots it needs ([`settle_trust`]).
//!
//! kube-rs's own choice of proxy is overridden: it takes `HTTPS_PROXY` for
//! any server, matches `NO_PROXY` against the proxy rather than the server,
//! and its in-cluster configuration sets none (client-go, in a Pod, reads
//! the environment like anywhere else).

use std::{
    future::Future,
    path::Path,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use anyhow::{Context as _, Result};
use http::Uri;
use kube::{
    client::{Body, ClientBuilder, ConfigExt as _, DynBody},
    config::{KubeConfigOptions, Kubeconfig},
    Config,
};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt as _};

use crate::{
    connect::{kubectl_proxy, Proxy, Trust},
    route::Route,
};

/// The configuration, and the `proxy-url` of the kubeconfig's cluster for
/// the context (which kube-rs does not tell apart from `HTTPS_PROXY`).
pub async fn load(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<(Config, Option<String>)> {
    let kc = match kubeconfig {
        Some(path) => Kubeconfig::read_from(path)
            .with_context(|| format!("reading kubeconfig {}", path.display()))?,
        None => match Kubeconfig::read() {
            Ok(kc) => kc,
            // No kubeconfig at all: in a Pod, its service account, as
            // kubectl falls back to it.
            Err(e) if context.is_none() => {
                let config = Config::incluster().map_err(|ic| {
                    anyhow::anyhow!(
                        "no Kubernetes API configuration: not in a Pod ({ic}), and no \
                         kubeconfig ({e})"
                    )
                })?;
                return Ok((config, None));
            }
            Err(e) => {
                return Err(e).context("reading the kubeconfig ($KUBECONFIG, else ~/.kube/config)")
            }
        },
    };
    let proxy_url = cluster_proxy_url(&kc, context);
    let opts = KubeConfigOptions {
        context: context.map(str::to_owned),
        ..Default::default()
    };
    let config = Config::from_custom_kubeconfig(kc, &opts)
        .await
        .with_context(|| match context {
            Some(c) => format!("kubeconfig context {c:?}"),
            None => "kubeconfig".to_owned(),
        })?;
    Ok((config, proxy_url))
}

/// The `proxy-url` of the cluster `context` (else the current context)
/// names.
pub fn cluster_proxy_url(kc: &Kubeconfig, context: Option<&str>) -> Option<String> {
    let name = context.or(kc.current_context.as_deref())?;
    let ctx = kc
        .contexts
        .iter()
        .find(|c| c.name == name)?
        .context
        .as_ref()?;
    let cluster = kc.clusters.iter().find(|c| c.name == ctx.cluster)?;
    cluster.cluster.as_ref()?.proxy_url.clone()
}

/// Set `config`'s proxy to the one kubectl would take for its server
/// (`proxy_url`: the kubeconfig cluster's, from [`load`]; `env`: the
/// environment), or none; the proxy chosen, for the log. A proxy that is
/// not a URL, or of a kind neither client speaks, is an error naming it and
/// where it came from.
pub fn settle_proxy(
    config: &mut Config,
    proxy_url: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<Proxy>> {
    config.proxy_url = None;
    let Some(p) = kubectl_proxy(&config.cluster_url, proxy_url, env) else {
        return Ok(None);
    };
    let shown = crate::connect::without_credentials(&p.url);
    let uri: http::Uri =
        (p.url.parse()).with_context(|| format!("the proxy {shown} ({}) is not a URL", p.from))?;
    if uri.host().is_none() || !matches!(uri.scheme_str(), Some("http" | "socks5")) {
        anyhow::bail!(
            "the proxy {shown} ({}): the API server is reached through an http:// proxy \
             (HTTP CONNECT) or a socks5:// one, not this",
            p.from
        );
    }
    config.proxy_url = Some(uri);
    Ok(Some(p))
}

/// Make `config` trust what it asks for and no more: a configuration that
/// verifies nothing gets an empty set of roots, so that building the client
/// never looks for the system's. Returns the trust decided.
pub fn settle_trust(config: &mut Config) -> Trust {
    let names_ca = config.root_cert.is_some();
    let t = Trust::of(&config.cluster_url, names_ca, config.accept_invalid_certs);
    if t == Trust::Unverified {
        config.root_cert = Some(Vec::new());
    }
    t
}

/// kube's client for `config`, as kube-rs builds it (its request layers:
/// base URI, retries of 429/503/504, credentials with their refresh, extra
/// and impersonation headers; a tracing span per request; its TLS) over
/// [`Route`]: the proxy with its credentials (SOCKS5's too, which kube-rs's
/// own connector drops), happy eyeballs, keepalive; the TCP connection,
/// the proxy's handshake and TLS all within the connect timeout; reads and
/// writes within `read_timeout` and `write_timeout` (kube-rs's defaults,
/// 295 s; the daemon sets no read timer: its requests bound themselves).
///
/// What kube-rs's own builder does that this does not: rebuild for the
/// expiry of a client certificate an exec credential plugin issued (its
/// reader is private to kube-rs); a token from such a plugin is refreshed
/// as before, by the credential layer.
pub fn client(config: Config) -> Result<kube::Client> {
    let route = Route::new(config.proxy_url.as_ref(), config.connect_timeout)?;
    let https = config.rustls_https_connector_with_connector(route)?;
    // The read and write timers as kube-rs sets them (its own connector
    // crate); the connect bound is `Timed`'s, whose error names the server.
    let mut connect = hyper_timeout::TimeoutConnector::new(Timed {
        inner: https,
        limit: config.connect_timeout,
    });
    connect.set_read_timeout(config.read_timeout);
    connect.set_write_timeout(config.write_timeout);
    let pooled: hyper_util::client::legacy::Client<_, Body> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(connect);
    let retry = (config.default_retry)
        .then(|| tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry()));
    // A span per request, as kube-rs's; a failed one is the caller's to
    // report (kube-rs's logs every 5xx as an error besides).
    let trace = tower_http::trace::TraceLayer::new_for_http()
        .make_span_with(|req: &http::Request<Body>| {
            tracing::debug_span!("HTTP", http.method = %req.method(), http.url = %req.uri())
        })
        .on_failure(());
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .layer(trace)
        .map_err(BoxError::from)
        .service(pooled)
        .map_response(|r| {
            r.map(|body| {
                Box::new(http_body_util::BodyExt::map_err(body, BoxError::from)) as Box<DynBody>
            })
        })
        .boxed();
    Ok(ClientBuilder::new(service, config.default_namespace.clone()).build())
}

/// A connector whose every connection (TCP, the proxy's handshake, TLS)
/// is made within `limit`, as kube-rs's bounds them.
#[derive(Clone)]
struct Timed<C> {
    inner: C,
    limit: Option<Duration>,
}

impl<C> Service<Uri> for Timed<C>
where
    C: Service<Uri> + Clone + Send + 'static,
    C::Future: Send,
    C::Error: Into<BoxError>,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let limit = self.limit;
        let what = dst.authority().map(|a| a.to_string()).unwrap_or_default();
        let connecting = self.inner.call(dst);
        Box::pin(async move {
            let Some(limit) = limit else {
                return connecting.await.map_err(Into::into);
            };
            match tokio::time::timeout(limit, connecting).await {
                Ok(r) => r.map_err(Into::into),
                Err(_) => Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("connecting to {what}: no answer within {limit:?}"),
                )
                .into()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(yaml: &str) -> Kubeconfig {
        Kubeconfig::from_yaml(yaml).unwrap()
    }

    const TWO: &str = "apiVersion: v1\nkind: Config\nclusters:\n\
        - name: lab\n  cluster:\n    server: https://203.0.113.1:6443\n    proxy-url: socks5://198.51.100.9:1080\n\
        - name: prod\n  cluster:\n    server: https://198.51.100.1:6443\n\
        contexts:\n- name: lab\n  context:\n    cluster: lab\n    user: u\n\
        - name: prod\n  context:\n    cluster: prod\n    user: u\n\
        current-context: prod\nusers:\n- name: u\n  user: {}\n";

    /// The proxy-url is the cluster's of the context asked for, else of the
    /// current one.
    #[test]
    fn the_proxy_url_is_the_contexts_clusters() {
        let kc = kubeconfig(TWO);
        assert_eq!(cluster_proxy_url(&kc, None), None, "prod has none");
        assert_eq!(
            cluster_proxy_url(&kc, Some("lab")).as_deref(),
            Some("socks5://198.51.100.9:1080")
        );
        assert_eq!(cluster_proxy_url(&kc, Some("nope")), None);
    }

    /// The context's cluster and its proxy reach kube-rs's configuration;
    /// an environment proxy NO_PROXY excludes does not (kube-rs alone would
    /// take it: it matches NO_PROXY against the proxy).
    #[tokio::test]
    async fn a_context_is_loaded_with_its_proxy() {
        let dir = std::env::temp_dir().join(format!("kubectl-arp_guard-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config");
        std::fs::write(&path, TWO).unwrap();
        let (config, proxy) = load(Some(&path), Some("lab")).await.unwrap();
        assert_eq!(config.cluster_url, "https://203.0.113.1:6443");
        assert_eq!(proxy.as_deref(), Some("socks5://198.51.100.9:1080"));
        let (config, proxy) = load(Some(&path), None).await.unwrap();
        assert_eq!(config.cluster_url, "https://198.51.100.1:6443");
        assert_eq!(proxy, None);
        let e = load(Some(&path), Some("nope")).await.unwrap_err();
        assert!(
            format!("{e:#}").contains("kubeconfig context \"nope\""),
            "{e:#}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The proxy kubectl would take becomes the client's, its credentials
    /// kept for the client and left out of what is shown; one the clients
    /// cannot speak is an error that names it without them.
    #[test]
    fn the_proxy_is_settled_as_kubectl_would_and_shown_without_credentials() {
        let mut c = Config::new("https://203.0.113.1:6443".parse().unwrap());
        c.proxy_url = Some("http://kube-rs-guess:3128".parse().unwrap());
        let none = settle_proxy(&mut c, None, |_| None).unwrap();
        assert_eq!(
            (none, c.proxy_url.clone()),
            (None, None),
            "kube-rs's guess dropped"
        );
        let env =
            |n: &str| (n == "HTTPS_PROXY").then(|| "http://u:p%40ss@198.51.100.9:3128".to_owned());
        let p = settle_proxy(&mut c, None, env).unwrap().unwrap();
        assert_eq!(p.from, "HTTPS_PROXY");
        assert_eq!(
            c.proxy_url.as_ref().unwrap().to_string(),
            "http://u:p%40ss@198.51.100.9:3128/"
        );
        let socks = settle_proxy(&mut c, Some("socks5://198.51.100.9:1080"), env).unwrap();
        assert_eq!(socks.unwrap().from, "the kubeconfig's proxy-url");
        let e = settle_proxy(&mut c, Some("https://u:secret@198.51.100.9:3128"), env).unwrap_err();
        let e = format!("{e:#}");
        assert!(
            e.contains("https://198.51.100.9:3128") && !e.contains("secret"),
            "{e}"
        );
        assert_eq!(c.proxy_url, None, "an error leaves no proxy");
    }
}
