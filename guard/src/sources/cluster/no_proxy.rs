//! The proxy to the API server, settled as kubectl settles it (the rule is
//! `guard_wire::connect::kubectl_proxy`, shared with `kubectl arp-guard`,
//! which uses the proxy). kube takes `HTTPS_PROXY` from the environment
//! for a kubeconfig whatever the server, and without its proxy feature,
//! which the guard leaves out, does not read `NO_PROXY` at all: an API
//! server a laptop excludes from its proxy would be refused. The guard
//! connects to the API server directly; what kubectl would reach through a
//! proxy is an error that says how to exclude it.

use guard_wire::connect::kubectl_proxy;

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
    // kube's proxy is the kubeconfig's proxy-url, else HTTPS_PROXY: which
    // one, from the environment.
    let from_env = ["HTTPS_PROXY", "https_proxy"]
        .iter()
        .find_map(|n| env(n).filter(|v| !v.is_empty()))
        .and_then(|p| p.parse::<http::Uri>().ok())
        .is_some_and(|p| p == proxy);
    let kubeconfig = (!from_env).then(|| proxy.to_string());
    let url = &config.cluster_url;
    let Some(p) = kubectl_proxy(url, kubeconfig.as_deref(), env) else {
        config.proxy_url = None;
        return Ok(());
    };
    let host = url.host().unwrap_or_default();
    Err(format!(
        "the API server {url} would be reached through the proxy {} ({}); arp-guard \
         connects to it directly and does not use a proxy: exclude it (NO_PROXY={host}) or \
         drop the proxy",
        p.url, p.from
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
