//! Which CA roots the client's TLS trusts, decided before kube-rs builds it.
//!
//! kube-rs builds a rustls configuration for every kubeconfig, also for a
//! plain-HTTP API, and one that names no CA gets the platform verifier,
//! which fails when the system has no CA bundle ("No CA certificates were
//! loaded from the system"): the guard would not start from a kubeconfig
//! that never needs those roots. The image ships Debian's bundle (for an API
//! server with a publicly signed certificate); outside it, or with the
//! bundle hidden, a kubeconfig that needs no system roots must still work.

/// Where the client's trust comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trust {
    /// The kubeconfig (or the service account) names its CA.
    OwnCa,
    /// Nothing is verified: plain HTTP, or `insecure-skip-tls-verify`.
    Unverified,
    /// HTTPS with no CA named: the system's bundle (`SSL_CERT_FILE`, else
    /// the usual paths such as /etc/ssl/certs/ca-certificates.crt).
    System,
}

/// The trust `config` asks for.
pub fn trust(config: &kube::Config) -> Trust {
    if config.root_cert.is_some() {
        Trust::OwnCa
    } else if config.cluster_url.scheme_str() == Some("http") || config.accept_invalid_certs {
        Trust::Unverified
    } else {
        Trust::System
    }
}

/// Make `config` trust what it asks for and no more: a configuration that
/// verifies nothing gets an empty set of roots, so that building the client
/// never looks for the system's. Returns the trust decided.
pub fn settle(config: &mut kube::Config) -> Trust {
    let t = trust(config);
    if t == Trust::Unverified {
        config.root_cert = Some(Vec::new());
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str) -> kube::Config {
        kube::Config::new(url.parse().unwrap())
    }

    #[test]
    fn only_https_without_a_ca_needs_the_system_roots() {
        let mut http = config("http://203.0.113.1:6443");
        assert_eq!(settle(&mut http), Trust::Unverified);
        assert_eq!(http.root_cert.as_deref(), Some(&[][..]));

        let mut public = config("https://api.example.com:6443");
        assert_eq!(settle(&mut public), Trust::System);
        assert_eq!(public.root_cert, None, "left to the system's bundle");

        let mut own = config("https://203.0.113.1:6443");
        own.root_cert = Some(vec![b"der".to_vec()]);
        assert_eq!(settle(&mut own), Trust::OwnCa);
        assert_eq!(own.root_cert, Some(vec![b"der".to_vec()]), "untouched");

        let mut insecure = config("https://203.0.113.1:6443");
        insecure.accept_invalid_certs = true;
        assert_eq!(settle(&mut insecure), Trust::Unverified);
    }
}
