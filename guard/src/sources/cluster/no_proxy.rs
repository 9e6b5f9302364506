//! `NO_PROXY` as kubectl reads it (Go's `httpproxy`), for the API server's
//! own address. kube reads `HTTPS_PROXY` from the environment for a
//! kubeconfig, but matches `NO_PROXY` against the proxy's URL, not the
//! server's: an API server a laptop excludes from its proxy would be sent
//! through it (or, for the daemon's watches, refused).

use std::net::IpAddr;

/// `NO_PROXY` (else `no_proxy`) from the environment.
pub fn from_env() -> String {
    std::env::var("NO_PROXY")
        .or_else(|_| std::env::var("no_proxy"))
        .unwrap_or_default()
}

/// Whether `no_proxy` (comma-separated: `*`, hosts and their subdomains,
/// `.domain`, IPs, CIDRs, each with an optional `:port`) excludes `url`.
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
    let name = name.trim_start_matches("*.").trim_start_matches('.');
    host == name || host.ends_with(&format!(".{name}"))
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

    #[test]
    fn no_proxy_excludes_as_kubectl_does() {
        let api = "https://api.prod.example.net:6443";
        assert!(ex("*", api));
        assert!(ex("localhost, api.prod.example.net", api));
        assert!(ex(".example.net", api), "a domain and its subdomains");
        assert!(ex("example.net", api));
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
