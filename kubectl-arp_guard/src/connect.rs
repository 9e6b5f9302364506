//! The plugin's client, from the kubeconfig as kubectl uses it
//! (`guard_wire::kubeconfig`: the file, the context, the proxy kubectl
//! would take, the TLS roots); the user's credentials as the kubeconfig
//! names them (tokens, client certificates, exec credential plugins:
//! kube-rs runs them, with the plugin's environment); the proxy reached
//! through HTTP CONNECT or SOCKS5, by kube-rs's connectors.

use std::path::Path;

use anyhow::{Context as _, Result};
use guard_wire::{
    connect::Trust,
    kubeconfig::{load, settle_proxy, settle_trust},
};
use kube::Client;

/// A client for `context` (else the current one) of `kubeconfig` (else
/// kubectl's), through the proxy kubectl would use.
pub async fn client(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Client> {
    // Several rustls providers could be compiled in; name ours. An error only
    // means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (mut config, proxy_url) = load(kubeconfig, context).await?;
    settle_proxy(&mut config, proxy_url.as_deref(), |n| std::env::var(n).ok())?;
    let trust = settle_trust(&mut config);
    let url = config.cluster_url.clone();
    guard_wire::kubeconfig::client(config).with_context(|| match trust {
        Trust::System => format!(
            "building the Kubernetes client (the kubeconfig names no CA for {url}: the \
             system's certificates are needed, or the kubeconfig's certificate-authority(-data))"
        ),
        Trust::OwnCa | Trust::Unverified => "building the Kubernetes client".to_owned(),
    })
}
