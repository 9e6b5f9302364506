//! How the API server is reached, as kubectl (client-go) reaches it: which
//! proxy, and which TLS roots. The guard and `kubectl arp-guard` both build
//! their clients from a kubeconfig (`kubeconfig`) and judge these alike,
//! through the same route (`route`).
//!
//! kube-rs's own reading differs from kubectl's: it takes `HTTPS_PROXY` for
//! any server, matches `NO_PROXY` against the proxy's URL rather than the
//! server's, and sets no proxy in a Pod. Hence the rules here, with the
//! environment passed in.

use std::net::IpAddr;

/// A proxy kubectl would use for the API server, and where it was set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proxy {
    /// As a URL (`http://`, `https://` or `socks5://`).
    pub url: String,
    /// `the kubeconfig's proxy-url`, `HTTPS_PROXY` or `HTTP_PROXY`.
    pub from: &'static str,
}

/// The proxy kubectl would use to reach `server`: the kubeconfig cluster's
/// `proxy-url` as it is (client-go applies no `NO_PROXY` to it, and uses
/// it for a loopback server too), else the environment as Go's
/// `ProxyFromEnvironment` reads it: `HTTPS_PROXY` for an https:// server,
/// `HTTP_PROXY` for an http:// one (upper case first, then lower; empty is
/// unset; a value without a scheme is `http://`), unless the server is
/// loopback or `NO_PROXY` excludes it ([`excludes`]). None: directly.
pub fn kubectl_proxy(
    server: &http::Uri,
    proxy_url: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
) -> Option<Proxy> {
    if let Some(url) = proxy_url.filter(|u| !u.is_empty()) {
        return Some(Proxy {
            url: url.to_owned(),
            from: "the kubeconfig's proxy-url",
        });
    }
    // The first of `names` set to something, as Go's proxy settings read them.
    let any = |names: [&str; 2]| names.iter().find_map(|n| env(n).filter(|v| !v.is_empty()));
    let (value, from) = if server.scheme_str() == Some("http") {
        (any(["HTTP_PROXY", "http_proxy"])?, "HTTP_PROXY")
    } else {
        (any(["HTTPS_PROXY", "https_proxy"])?, "HTTPS_PROXY")
    };
    if excludes(&any(["NO_PROXY", "no_proxy"]).unwrap_or_default(), server) {
        return None;
    }
    Some(Proxy {
        url: with_scheme(&value),
        from,
    })
}

/// A proxy URL as it may be shown or logged: its `user:password@` left out.
pub fn without_credentials(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let path = if path == "/" { "" } else { path };
    if scheme.is_empty() {
        format!("{host}{path}")
    } else {
        format!("{scheme}://{host}{path}")
    }
}

/// A proxy from the environment as Go reads it: one without a scheme Go
/// knows for a proxy is `http://` (`proxy.corp:3128`).
fn with_scheme(value: &str) -> String {
    let known = value
        .split_once("://")
        .is_some_and(|(s, _)| ["http", "https", "socks5"].contains(&&*s.to_ascii_lowercase()));
    if known {
        value.to_owned()
    } else {
        format!("http://{value}")
    }
}

/// Whether kubectl would go to `url` directly: a loopback server, or one
/// that `no_proxy` excludes (comma-separated: `*`; `name`, the name and its
/// subdomains; `.name` or `*.name`, its subdomains only; an IP; a CIDR;
/// each with an optional `:port`).
pub fn excludes(no_proxy: &str, url: &http::Uri) -> bool {
    let Some(host) = url.host() else {
        return false;
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    let port = url
        .port_u16()
        .unwrap_or(if url.scheme_str() == Some("http") {
            80
        } else {
            443
        });
    let ip: Option<IpAddr> = host.parse().ok();
    if host == "localhost" || ip.is_some_and(|ip| ip.is_loopback()) {
        return true;
    }
    no_proxy
        .split(',')
        .map(|e| e.trim().to_ascii_lowercase())
        .filter(|e| !e.is_empty())
        .any(|e| entry_matches(&e, &host, ip, port))
}

fn entry_matches(entry: &str, host: &str, ip: Option<IpAddr>, port: u16) -> bool {
    if entry == "*" {
        return true;
    }
    if let Some((net, len)) = entry.split_once('/') {
        let (Some(ip), Ok(net), Ok(len)) = (ip, net.parse::<IpAddr>(), len.parse::<u32>()) else {
            return false;
        };
        return in_prefix(ip, net, len);
    }
    if let Ok(e) = entry
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    {
        return ip == Some(e);
    }
    // host[:port] (an IPv6 entry with a port is bracketed: [fd00::1]:6443).
    let (name, want_port) = match entry.rsplit_once(':') {
        Some((n, p)) if !n.contains(':') || n.ends_with(']') => (n, p.parse::<u16>().ok()),
        _ => (entry, None),
    };
    if want_port.is_some_and(|p| p != port) {
        return false;
    }
    let name = name.trim_start_matches('[').trim_end_matches(']');
    if let Ok(e) = name.parse::<IpAddr>() {
        return ip == Some(e);
    }
    // `*.name` is `.name`: its subdomains only.
    let name = name.strip_prefix('*').unwrap_or(name);
    match name.strip_prefix('.') {
        Some(domain) => host.ends_with(&format!(".{domain}")),
        None => host == name || host.ends_with(&format!(".{name}")),
    }
}

fn in_prefix(ip: IpAddr, net: IpAddr, len: u32) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) if len <= 32 => {
            let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) if len <= 128 => {
            let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// Where the client's TLS trust comes from. kube-rs builds a rustls
/// configuration for every kubeconfig, also for a plain-HTTP API, and one
/// that names no CA gets the platform's verifier, which fails where the
/// system has no CA bundle ("No CA certificates were loaded from the
/// system"): a kubeconfig that never needs those roots must not depend on
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trust {
    /// The kubeconfig (or the service account) names its CA.
    OwnCa,
    /// Nothing is verified: plain HTTP, or `insecure-skip-tls-verify`
    /// (the client gets an empty set of roots, so that building it never
    /// looks for the system's).
    Unverified,
    /// HTTPS with no CA named: the system's (the platform's store; in the
    /// image, Debian's bundle, or `SSL_CERT_FILE`).
    System,
}

impl Trust {
    /// The trust a configuration asks for: its server's scheme, whether
    /// it names a CA, whether it skips verification.
    pub fn of(server: &http::Uri, names_ca: bool, insecure: bool) -> Trust {
        if names_ca {
            Trust::OwnCa
        } else if server.scheme_str() == Some("http") || insecure {
            Trust::Unverified
        } else {
            Trust::System
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(no_proxy: &str, url: &str) -> bool {
        excludes(no_proxy, &url.parse().unwrap())
    }

    fn proxy(server: &str, proxy_url: Option<&str>, env: &[(&str, &str)]) -> Option<Proxy> {
        let env: std::collections::BTreeMap<&str, &str> = env.iter().copied().collect();
        kubectl_proxy(&server.parse().unwrap(), proxy_url, |n| {
            env.get(n).map(|v| v.to_string())
        })
    }

    /// A kubeconfig's proxy-url is used as it is: NO_PROXY does not drop
    /// it, nor does a loopback server (client-go's `http.ProxyURL`).
    #[test]
    fn the_kubeconfigs_proxy_url_is_used_as_it_is() {
        let p = "socks5://198.51.100.9:1080";
        let want = Some(Proxy {
            url: p.into(),
            from: "the kubeconfig's proxy-url",
        });
        let env = [
            ("NO_PROXY", "*"),
            ("HTTPS_PROXY", "http://198.51.100.8:3128"),
        ];
        assert_eq!(proxy("https://203.0.113.1:6443", Some(p), &env), want);
        assert_eq!(proxy("https://127.0.0.1:6443", Some(p), &[]), want);
        assert_eq!(proxy("https://203.0.113.1:6443", None, &[]), None);
    }

    /// The environment as Go reads it: HTTPS_PROXY for https, HTTP_PROXY
    /// for http (never the other), upper case first, empty is unset, no
    /// scheme is http://, and NO_PROXY (or loopback) is matched against
    /// the server, never against the proxy.
    #[test]
    fn the_environments_proxy_is_judged_as_kubectl_judges_it() {
        let api = "https://203.0.113.1:6443";
        let https = |v: &'static str| {
            Some(Proxy {
                url: v.into(),
                from: "HTTPS_PROXY",
            })
        };
        let p = "http://198.51.100.9:3128";
        assert_eq!(proxy(api, None, &[("HTTPS_PROXY", p)]), https(p));
        assert_eq!(proxy(api, None, &[("https_proxy", p)]), https(p));
        assert_eq!(
            proxy(api, None, &[("HTTPS_PROXY", ""), ("https_proxy", p)]),
            https(p),
            "empty is unset"
        );
        assert_eq!(
            proxy(api, None, &[("HTTPS_PROXY", "proxy.corp:3128")]),
            https("http://proxy.corp:3128")
        );
        assert_eq!(
            proxy(api, None, &[("HTTP_PROXY", p)]),
            None,
            "not for https"
        );
        let no = [("HTTPS_PROXY", p), ("NO_PROXY", "203.0.113.0/24")];
        assert_eq!(proxy(api, None, &no), None);
        let other = [("HTTPS_PROXY", p), ("NO_PROXY", "198.51.100.9")];
        assert_eq!(proxy(api, None, &other), https(p), "the proxy's own name");
        assert_eq!(proxy("https://localhost:6443", None, &no[..1]), None);
        let plain = "http://203.0.113.1:8080";
        assert_eq!(proxy(plain, None, &[("HTTPS_PROXY", p)]), None);
        let q = "http://198.51.100.8:3128";
        assert_eq!(
            proxy(plain, None, &[("http_proxy", q)]),
            Some(Proxy {
                url: q.into(),
                from: "HTTP_PROXY"
            })
        );
        assert_eq!(
            proxy(plain, None, &[("HTTP_PROXY", q), ("no_proxy", "*")]),
            None
        );
    }

    #[test]
    fn no_proxy_excludes_as_kubectl_does() {
        let api = "https://api.prod.example.net:6443";
        assert!(ex("*", api));
        assert!(ex("localhost, api.prod.example.net", api));
        assert!(ex(".example.net", api), "its subdomains");
        assert!(ex("*.example.net", api));
        assert!(
            !ex(".example.net", "https://example.net"),
            "not the name itself"
        );
        assert!(
            ex("example.net", "https://example.net"),
            "the name and its subdomains"
        );
        assert!(ex("example.net", api));
        assert!(ex("a,,example.net,", api), "empty entries are skipped");
        assert!(
            ex("", "https://127.0.0.1:6443"),
            "loopback: never through a proxy"
        );
        assert!(ex("", "https://localhost:6443"));
        assert!(ex("", "https://[::1]:6443"));
        assert!(ex("api.prod.example.net:6443", api));
        assert!(!ex("api.prod.example.net:443", api), "another port");
        assert!(!ex("xample.net", api), "not a suffix of a label");
        assert!(!ex("", api));
        let ip = "https://203.0.113.10:6443";
        assert!(ex("203.0.113.0/24", ip));
        assert!(ex("203.0.113.10", ip));
        assert!(!ex(
            "203.0.113.0/28, 198.51.100.10",
            "https://203.0.113.20:6443"
        ));
        assert!(ex("fd00::/8", "https://[fd00::1]:6443"));
        assert!(ex("[fd00::1]:6443", "https://[fd00::1]:6443"));
        assert!(!ex("fd00::2", "https://[fd00::1]:6443"));
        assert!(!ex("203.0.113.0/99", ip), "a bad prefix matches nothing");
    }

    #[test]
    fn only_https_without_a_ca_needs_the_system_roots() {
        let uri = |u: &str| -> http::Uri { u.parse().unwrap() };
        let http = uri("http://203.0.113.1:6443");
        let https = uri("https://api.example.com:6443");
        assert_eq!(Trust::of(&http, false, false), Trust::Unverified);
        assert_eq!(Trust::of(&https, false, false), Trust::System);
        assert_eq!(Trust::of(&https, true, false), Trust::OwnCa);
        assert_eq!(Trust::of(&https, true, true), Trust::OwnCa);
        assert_eq!(Trust::of(&https, false, true), Trust::Unverified);
    }

    #[test]
    fn a_proxy_is_shown_without_its_credentials() {
        assert_eq!(
            without_credentials("http://u:p%40ss@198.51.100.9:3128/"),
            "http://198.51.100.9:3128"
        );
        assert_eq!(
            without_credentials("socks5://198.51.100.9:1080"),
            "socks5://198.51.100.9:1080"
        );
        assert_eq!(without_credentials("u:p@proxy:3128"), "proxy:3128");
    }
}
