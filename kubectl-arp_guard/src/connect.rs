//! The plugin's client, from the kubeconfig as kubectl uses it: `--kubeconfig`,
//! else `$KUBECONFIG` (a list, merged), else `~/.kube/config`, else the Pod's
//! service account; `--context`, else the current one; the user's
//! credentials as the kubeconfig names them (tokens, client certificates,
//! exec credential plugins: kube-rs runs them, with the plugin's
//! environment); and the proxy kubectl would take ([`kubectl_proxy`]: the
//! cluster's `proxy-url`, else `HTTPS_PROXY`/`HTTP_PROXY` unless `NO_PROXY`
//! excludes the server), through HTTP CONNECT or SOCKS5.
//!
//! kube-rs's own choice of proxy is overridden: it takes `HTTPS_PROXY` for
//! any server and matches `NO_PROXY` against the proxy, not the server.

use std::path::Path;

use anyhow::{Context as _, Result};
use guard_wire::connect::{kubectl_proxy, Trust};
use kube::{
    config::{KubeConfigOptions, Kubeconfig},
    Client, Config,
};

/// A client for `context` (else the current one) of `kubeconfig` (else
/// kubectl's), through the proxy kubectl would use.
pub async fn client(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Client> {
    // Several rustls providers could be compiled in; name ours. An error only
    // means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (mut config, proxy_url) = load(kubeconfig, context).await?;
    let env = |name: &str| std::env::var(name).ok();
    let proxy = kubectl_proxy(&config.cluster_url, proxy_url.as_deref(), env);
    config.proxy_url = match proxy {
        None => None,
        Some(p) => Some(
            (p.url.parse())
                .with_context(|| format!("the proxy {} ({}) is not a URL", p.url, p.from))?,
        ),
    };
    let trust = Trust::of(
        &config.cluster_url,
        config.root_cert.is_some(),
        config.accept_invalid_certs,
    );
    if trust == Trust::Unverified {
        // Nothing to verify: no roots, so that none are looked for.
        config.root_cert = Some(Vec::new());
    }
    let url = config.cluster_url.clone();
    Client::try_from(config).with_context(|| match trust {
        Trust::System => format!(
            "building the Kubernetes client (the kubeconfig names no CA for {url}: the \
             system's certificates are needed, or the kubeconfig's certificate-authority(-data))"
        ),
        Trust::OwnCa | Trust::Unverified => "building the Kubernetes client".to_owned(),
    })
}

/// The configuration, and the `proxy-url` of the kubeconfig's cluster for
/// the context (which kube-rs does not tell apart from `HTTPS_PROXY`).
async fn load(
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
                        "no Kubernetes API configuration: no kubeconfig ({e}), and not in a \
                         Pod ({ic})"
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
fn cluster_proxy_url(kc: &Kubeconfig, context: Option<&str>) -> Option<String> {
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

/// `NO_PROXY` as kube-rs can read it, meaning to kubectl what it meant:
/// kube-rs reads `NO_PROXY` itself while it loads a kubeconfig under a
/// proxy, and fails on what Go's reader skips or takes in its stride (an
/// empty entry: `a,,b`, a trailing comma; `*` among other entries), although
/// its choice is then overridden. Empty entries dropped, `*` anywhere is
/// `*`. None: it reads as it is.
pub fn kube_readable_no_proxy(value: &str) -> Option<String> {
    let entries: Vec<&str> = (value.split(','))
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    let readable = if entries.contains(&"*") {
        "*".to_owned()
    } else {
        entries.join(",")
    };
    (readable != value).then_some(readable)
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

    #[test]
    fn no_proxy_is_made_readable_to_kube_rs_without_changing_its_meaning() {
        assert_eq!(kube_readable_no_proxy("a,b"), None);
        assert_eq!(kube_readable_no_proxy("a,,b,").as_deref(), Some("a,b"));
        assert_eq!(kube_readable_no_proxy(" a , b").as_deref(), Some("a,b"));
        assert_eq!(kube_readable_no_proxy("a,*").as_deref(), Some("*"));
        assert_eq!(kube_readable_no_proxy("*"), None);
        assert_eq!(kube_readable_no_proxy(",").as_deref(), Some(""));
    }
}
