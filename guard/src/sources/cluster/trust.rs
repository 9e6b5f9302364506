//! Which CA roots the client's TLS trusts, decided before kube-rs builds it
//! (the rule, [`Trust`], is `guard_wire::connect`'s, shared with `kubectl
//! arp-guard`). The image ships Debian's bundle (for an API server with a
//! publicly signed certificate); outside it, or with the bundle hidden, a
//! kubeconfig that needs no system roots must still work.

pub use guard_wire::connect::Trust;

/// The trust `config` asks for.
pub fn trust(config: &kube::Config) -> Trust {
    let names_ca = config.root_cert.is_some();
    Trust::of(&config.cluster_url, names_ca, config.accept_invalid_certs)
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
