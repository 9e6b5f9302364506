//! The proxy to the API server, settled as kubectl settles it. kube takes
//! `HTTPS_PROXY` from the environment for a kubeconfig but matches
//! `NO_PROXY` against the proxy's URL, not the server's (and without its
//! proxy feature, which arp-guard leaves out, it does not read `NO_PROXY` at
//! all): an API server a laptop excludes from its proxy would be refused.
//! arp-guard connects to the API server directly; what kubectl would reach
//! through a proxy is an error that says how to exclude it.

use std::net::IpAddr;

/// Drop the environment's proxy where kubectl would not use it for the API
/// server (`NO_PROXY`, or a loopback server); a proxy that remains (a
/// kubeconfig's `proxy-url` is used as it is, as client-go does) is an
/// error naming the proxy, where it came from and the fix.
pub fn settle(config: &mut kube::Config) -> Result<(), String> {
    settle_in(config, |name| std::env::var(name).ok())
}

/// [`settle`] with the environment given (tests pass their own).
fn settle_in(
    config: &mut kube::Config,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(), String> {
    let Some(proxy) = config.proxy_url.clone() else {
        return Ok(());
    };
    // The first of `names` set to something, as Go's proxy settings read them.
    let any = |names: [&str; 2]| names.iter().find_map(|n| env(n).filter(|v| !v.is_empty()));
    let url = &config.cluster_url;
    let from_env = any(["HTTPS_PROXY", "https_proxy"])
        .and_then(|p| p.parse::<http::Uri>().ok())
        .is_some_and(|p| p == proxy);
    let (proxy, from) = if !from_env {
        (Some(proxy.to_string()), "the kubeconfig's proxy-url")
    } else if url.scheme_str() == Some("http") {
        // kube takes HTTPS_PROXY whatever the scheme; kubectl, HTTP_PROXY
        // for an http:// server.
        (any(["HTTP_PROXY", "http_proxy"]), "HTTP_PROXY")
    } else {
        (Some(proxy.to_string()), "HTTPS_PROXY")
    };
    let excluded = from_env && excludes(&any(["NO_PROXY", "no_proxy"]).unwrap_or_default(), url);
    let Some(proxy) = proxy.filter(|_| !excluded) else {
        config.proxy_url = None;
        return Ok(());
    };
    let host = url.host().unwrap_or_default();
    Err(format!(
        "the API server {url} would be reached through the proxy {proxy} ({from}); arp-guard \
         connects to it directly and does not use a proxy: exclude it (NO_PROXY={host}) or \
         drop the proxy"
    ))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(no_proxy: &str, url: &str) -> bool {
        excludes(no_proxy, &url.parse().unwrap())
    }

    /// A kubeconfig's proxy-url is not for NO_PROXY to drop (client-go
    /// uses it as it is) and arp-guard uses none: an error that names it and
    /// the fix; no proxy, nothing to settle.
    #[test]
    fn a_proxy_that_remains_is_an_error_saying_how_to_exclude_the_server() {
        let mut c = kube::Config::new("https://203.0.113.1:6443".parse().unwrap());
        assert_eq!(settle_in(&mut c, |_| None), Ok(()));
        c.proxy_url = Some("http://198.51.100.9:3128".parse().unwrap());
        let e = settle_in(&mut c, |_| None).unwrap_err();
        for want in [
            "http://198.51.100.9:3128",
            "proxy-url",
            "NO_PROXY=203.0.113.1",
        ] {
            assert!(e.contains(want), "{want:?} in {e}");
        }
    }

    /// HTTPS_PROXY (which kube takes for any server) is dropped where
    /// kubectl would not use it: NO_PROXY excludes the server, or the
    /// server is http:// and HTTP_PROXY is not set (kubectl's proxy for it).
    #[test]
    fn the_environments_proxy_is_judged_as_kubectl_judges_it() {
        let proxy = "http://198.51.100.9:3128";
        let run = |server: &str, env: &[(&str, &str)]| {
            let mut c = kube::Config::new(server.parse().unwrap());
            c.proxy_url = Some(proxy.parse().unwrap());
            let env: std::collections::BTreeMap<String, String> = (env.iter())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .chain([("HTTPS_PROXY".to_owned(), proxy.to_owned())])
                .collect();
            settle_in(&mut c, |n| env.get(n).cloned()).map(|()| c.proxy_url)
        };
        let api = "https://203.0.113.1:6443";
        assert_eq!(run(api, &[("NO_PROXY", "203.0.113.0/24")]), Ok(None));
        let e = run(api, &[("NO_PROXY", "example.net")]).unwrap_err();
        assert!(
            e.contains("(HTTPS_PROXY)") && e.contains("NO_PROXY=203.0.113.1"),
            "{e}"
        );
        let plain = "http://203.0.113.1:8080";
        assert_eq!(
            run(plain, &[]),
            Ok(None),
            "no HTTP_PROXY: kubectl goes direct"
        );
        let e = run(plain, &[("http_proxy", "http://198.51.100.8:3128")]).unwrap_err();
        assert!(
            e.contains("198.51.100.8") && e.contains("(HTTP_PROXY)"),
            "{e}"
        );
        let excluded = [
            ("HTTP_PROXY", "http://198.51.100.8:3128"),
            ("NO_PROXY", "*"),
        ];
        assert_eq!(run(plain, &excluded), Ok(None));
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
}
