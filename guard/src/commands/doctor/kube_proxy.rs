//! kube-proxy's mode and `strictARP`, from the `kube-system/kube-proxy`
//! ConfigMap (kubeadm's and kubespray's: a KubeProxyConfiguration under
//! `config.conf`), when the Kubernetes API answers within a short timeout.

use std::{path::Path, time::Duration};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use serde::Deserialize;

use super::report::{Check, CheckStatus};
use crate::sources::cluster::{
    cause::{Cause, Failure},
    task,
};

pub const NAMESPACE: &str = "kube-system";
pub const NAME: &str = "kube-proxy";
pub const KEY: &str = "config.conf";

/// What the ConfigMap says, or why it could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeProxy {
    /// Not read: the reason, and what would let doctor read it.
    Skipped {
        why: String,
        fix: Option<String>,
    },
    /// There, but not a KubeProxyConfiguration doctor can read.
    Unreadable(String),
    Found {
        mode: String,
        strict_arp: bool,
    },
}

#[derive(Debug, Deserialize)]
struct Configuration {
    kind: Option<String>,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    ipvs: Option<Ipvs>,
}

#[derive(Debug, Deserialize)]
struct Ipvs {
    #[serde(default, rename = "strictARP")]
    strict_arp: Option<bool>,
}

/// Read `config.conf` of the ConfigMap (a KubeProxyConfiguration).
pub fn parse(data: Option<&str>) -> KubeProxy {
    let Some(text) = data else {
        return KubeProxy::Unreadable(format!("the ConfigMap has no {KEY}"));
    };
    let mut o = serde_saphyr::Options::default();
    o.budget = Some(serde_saphyr::Budget::default());
    o.with_snippet = false;
    match serde_saphyr::from_str_with_options::<Configuration>(text, o) {
        Ok(c)
            if c.kind
                .as_deref()
                .is_some_and(|k| k != "KubeProxyConfiguration") =>
        {
            KubeProxy::Unreadable(format!(
                "{KEY} is a {}, not a KubeProxyConfiguration",
                c.kind.unwrap_or_default()
            ))
        }
        Ok(c) => KubeProxy::Found {
            mode: c.mode.unwrap_or_default(),
            strict_arp: c.ipvs.and_then(|i| i.strict_arp).unwrap_or(false),
        },
        Err(e) => {
            let msg = e.to_string();
            KubeProxy::Unreadable(format!(
                "{KEY} does not parse: {}",
                msg.lines().next().unwrap_or(&msg)
            ))
        }
    }
}

/// Ask the API for the ConfigMap, within `timeout`.
pub async fn read(kubeconfig: Option<&Path>, timeout: Duration) -> KubeProxy {
    let ask = async {
        let client = match task::client(kubeconfig).await {
            Ok(c) => c,
            Err(e) => {
                // kube's errors repeat their sources in their text: the
                // first two links of the chain say it all.
                let why = e.chain().take(2).map(|c| c.to_string()).collect::<Vec<_>>();
                return KubeProxy::Skipped {
                    why: format!("no Kubernetes API to ask: {}", why.join(": ")),
                    fix: Some(
                        "run doctor where a kubeconfig works (--kubeconfig) to check kube-proxy's strictARP"
                            .into(),
                    ),
                };
            }
        };
        match Api::<ConfigMap>::namespaced(client, NAMESPACE)
            .get_opt(NAME)
            .await
        {
            Ok(Some(cm)) => parse(
                cm.data
                    .as_ref()
                    .and_then(|d| d.get(KEY))
                    .map(String::as_str),
            ),
            Ok(None) => KubeProxy::Skipped {
                why: format!(
                    "no ConfigMap {NAMESPACE}/{NAME}: kube-proxy is not deployed the kubeadm way, or \
                     is replaced (Cilium's kube-proxy replacement: no kube-ipvs0)"
                ),
                fix: None,
            },
            Err(e) => failed(&Failure::of("get", &e)),
        }
    };
    match tokio::time::timeout(timeout, ask).await {
        Ok(k) => k,
        Err(_) => failed(&Failure::timeout("get", timeout)),
    }
}

fn failed(f: &Failure) -> KubeProxy {
    let fix = match f.cause {
        Cause::Forbidden => format!(
            "allow this user get on configmaps/{NAME} in {NAMESPACE} (deploy/base/rbac.yaml's \
             arp-guard-doctor Role does it for arp-guard's ServiceAccount), or run doctor with an \
             admin's --kubeconfig"
        ),
        c if !c.fix().is_empty() => c.fix().to_owned(),
        _ => "check the API address and that it answers (--kube-timeout to wait longer)".to_owned(),
    };
    KubeProxy::Skipped {
        why: format!(
            "cannot read {NAMESPACE}/{NAME}: {} ({})",
            f.cause.summary(),
            f.text.chars().take(300).collect::<String>()
        ),
        fix: Some(fix),
    }
}

/// The `kube_proxy` check.
pub fn check(k: &KubeProxy) -> Check {
    let name = "kube_proxy";
    let strict_fix = "kubectl -n kube-system edit configmap kube-proxy: set ipvs.strictARP: true, \
                      then restart kube-proxy (kubectl -n kube-system rollout restart ds/kube-proxy)";
    match k {
        KubeProxy::Skipped { why, fix } => {
            let c = Check::new(name, None, CheckStatus::Skip, "not read", why.clone());
            match fix {
                Some(f) => c.fix(f.clone()),
                None => c,
            }
        }
        KubeProxy::Unreadable(why) => {
            Check::new(name, None, CheckStatus::Warn, "unreadable", why.clone()).fix(format!(
                "check {NAMESPACE}/{NAME} {KEY}; kube-proxy may also take --proxy-mode and --ipvs-strict-arp as flags"
            ))
        }
        KubeProxy::Found { mode, strict_arp } => {
            let value = format!(
                "mode {}, strictARP {strict_arp}",
                if mode.is_empty() { "\"\" (iptables)" } else { mode }
            );
            match (mode.as_str(), strict_arp) {
                ("ipvs", true) => Check::new(
                    name,
                    None,
                    CheckStatus::Pass,
                    value,
                    "kube-proxy sets arp_ignore=1 and arp_announce=2 (conf/all) on every node, so kernels do not answer ARP for kube-ipvs0's Service IPs",
                ),
                ("ipvs", false) => Check::new(
                    name,
                    None,
                    CheckStatus::Warn,
                    value,
                    "IPVS puts every LoadBalancer IP on kube-ipvs0 of every node and, without strictARP, leaves arp_ignore=0: every node's kernel answers ARP for every LB IP unless the node's sysctls or arp-guard stop it (see arp_ignore)",
                )
                .fix(strict_fix),
                _ => Check::new(
                    name,
                    None,
                    CheckStatus::Pass,
                    value,
                    "not IPVS: Service IPs are not bound to kube-ipvs0, so kube-proxy makes no kernel answer ARP for them (announcers and stale caches still can)",
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubeadm_config() {
        let conf = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
                    bindAddress: 0.0.0.0\nipvs:\n  scheduler: \"\"\n  strictARP: false\n  syncPeriod: 0s\nmode: ipvs\n";
        assert_eq!(
            parse(Some(conf)),
            KubeProxy::Found {
                mode: "ipvs".into(),
                strict_arp: false
            }
        );
        let c = check(&parse(Some(conf)));
        assert_eq!(c.status, CheckStatus::Warn);
        assert_eq!(c.value, "mode ipvs, strictARP false");
        assert!(c.fix.unwrap().contains("strictARP: true"));

        let strict = conf.replace("strictARP: false", "strictARP: true");
        assert_eq!(check(&parse(Some(&strict))).status, CheckStatus::Pass);
        // kubeadm's default mode is "" (iptables); nftables binds nothing either.
        for mode in ["mode: \"\"", "mode: nftables", "mode: iptables"] {
            let c = check(&parse(Some(&conf.replace("mode: ipvs", mode))));
            assert_eq!(c.status, CheckStatus::Pass, "{mode}");
        }
        // No ipvs section, no mode at all.
        assert_eq!(
            parse(Some("kind: KubeProxyConfiguration\n")),
            KubeProxy::Found {
                mode: String::new(),
                strict_arp: false
            }
        );
    }

    #[test]
    fn unreadable_configs_warn() {
        for (data, needle) in [
            (None, "no config.conf"),
            (
                Some("kind: KubeletConfiguration\n"),
                "not a KubeProxyConfiguration",
            ),
            (Some("ipvs: [unclosed\n"), "does not parse"),
            (Some("ipvs:\n  strictARP: maybe\n"), "does not parse"),
            (Some("a: &a [*a, *a]\n"), "does not parse"),
        ] {
            let k = parse(data);
            match &k {
                KubeProxy::Unreadable(why) => assert!(why.contains(needle), "{why}"),
                other => panic!("{data:?}: {other:?}"),
            }
            assert_eq!(check(&k).status, CheckStatus::Warn);
        }
    }

    #[test]
    fn skipped_says_why() {
        let k = failed(&Failure::new(Cause::Forbidden, "get: 403"));
        let c = check(&k);
        assert_eq!(c.status, CheckStatus::Skip);
        assert!(c.why.contains("403 Forbidden"), "{}", c.why);
        assert!(c.fix.unwrap().contains("configmaps/kube-proxy"));
    }
}
