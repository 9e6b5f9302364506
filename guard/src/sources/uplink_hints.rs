//! What the cluster says of this node's uplinks, for `--interface auto`:
//! the Node's InternalIP and ExternalIP (read once, from the API server's
//! cache, retried with back-off until it answers), and the interfaces the
//! announcers' own objects name: MetalLB's L2Advertisements (`interfaces`,
//! names) and Cilium's CiliumL2AnnouncementPolicies (`interfaces`, regular
//! expressions), each followed with one watch.
//!
//! Node selectors are not read: the kernel of a node that does not announce
//! still answers ARP on every interface (the flux this guard stops), so an
//! interface an announcer names is guarded on every node.
//!
//! None of this is needed to guard: until it answers, the routes decide
//! alone, and a kind the cluster does not have (its CRD missing, 404) or
//! this guard may not read (403) is asked again only every
//! [`ABSENT_RETRY`]. At rest this costs one watch request per follower per
//! [`follow::WATCH_TIMEOUT`] (290 s).

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use kube::Client;
use serde::Deserialize;
use tokio::sync::{mpsc, watch};

use crate::{
    model::uplinks::{Hints, NameRule, Named},
    sources::{
        cluster::{
            decode::{Meta, Obj, Object},
            dial::Dialer,
            stream::backoff,
            task::connections,
        },
        presence::follow::{self, Collection, Step},
    },
};

/// A kind the API does not serve here, or may not be read, is asked again
/// after this long.
const ABSENT_RETRY: Duration = Duration::from_secs(600);
/// The Node's first retry; doubling to 30 s (`backoff`).
const NODE_RETRY: Duration = Duration::from_secs(1);
/// Each Node read gives up after this long.
const NODE_TIMEOUT: Duration = Duration::from_secs(10);
/// Objects of one kind taken at most, and interface rules per object: an
/// operator's objects, not an attacker's, but bounded all the same.
const MAX_OBJECTS: usize = 256;
const MAX_RULES: usize = 64;
/// Compiled size of one regular expression at most.
const REGEX_SIZE: usize = 1 << 20;

/// Which objects to follow.
#[derive(Debug, Clone)]
pub struct HintsConfig {
    pub kubeconfig: Option<PathBuf>,
    pub node: String,
    /// MetalLB's namespace (its L2Advertisements), when MetalLB announces.
    pub metallb: Option<String>,
    /// Cilium announces (its cluster-wide policies).
    pub cilium: bool,
}

/// Start following; the hints are published on the returned channel.
pub fn spawn(cfg: HintsConfig) -> watch::Receiver<Hints> {
    let (tx, rx) = watch::channel(Hints::default());
    tokio::spawn(run(cfg, tx));
    rx
}

async fn run(cfg: HintsConfig, tx: watch::Sender<Hints>) {
    let (client, dialer) = match connections(cfg.kubeconfig.as_deref()).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "uplink hints: no Kubernetes client; the routes alone choose the uplinks");
            // Held open: the daemon keeps waiting on a channel that never changes.
            tx.closed().await;
            return;
        }
    };
    let (steps_tx, mut steps) = mpsc::channel::<(Kind, Step<Announcement>)>(64);
    if let Some(ns) = &cfg.metallb {
        let path = format!("/apis/metallb.io/v1beta1/namespaces/{ns}/l2advertisements");
        tokio::spawn(keep_following(
            Kind::MetalLb,
            client.clone(),
            dialer.clone(),
            path,
            steps_tx.clone(),
        ));
    }
    if cfg.cilium {
        let path = "/apis/cilium.io/v2alpha1/ciliuml2announcementpolicies".to_owned();
        tokio::spawn(keep_following(
            Kind::Cilium,
            client.clone(),
            dialer,
            path,
            steps_tx.clone(),
        ));
    }
    drop(steps_tx);
    let mut node = std::pin::pin!(node_ips(client, cfg.node.clone()));
    let mut objects: BTreeMap<(Kind, String), Named> = BTreeMap::new();
    let (mut node_done, mut steps_open) = (false, true);
    loop {
        if node_done && !steps_open {
            // Nothing more to follow: held open, the daemon keeps the hints.
            tx.closed().await;
            return;
        }
        tokio::select! {
            ips = &mut node, if !node_done => {
                node_done = true;
                tracing::info!(node = %cfg.node, addresses = ?ips, "uplink hints: the Node's addresses");
                tx.send_modify(|h| h.node_ips = Some(ips));
            }
            step = steps.recv(), if steps_open => {
                let Some((kind, step)) = step else {
                    steps_open = false;
                    continue;
                };
                if apply(&mut objects, kind, step) {
                    let named: Vec<Named> = objects.values().cloned().collect();
                    tx.send_if_modified(|h| {
                        let changed = h.named != named;
                        h.named = named;
                        changed
                    });
                }
            }
        }
    }
}

/// Whose objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    MetalLb,
    Cilium,
}

impl Kind {
    fn object(self) -> &'static str {
        match self {
            Kind::MetalLb => "L2Advertisement",
            Kind::Cilium => "CiliumL2AnnouncementPolicy",
        }
    }
}

/// Apply one step of a follower; whether the named interfaces changed.
fn apply(
    objects: &mut BTreeMap<(Kind, String), Named>,
    kind: Kind,
    step: Step<Announcement>,
) -> bool {
    let before = objects.clone();
    match step {
        Step::Listed(items) => {
            objects.retain(|(k, _), _| *k != kind);
            for o in items {
                add(objects, kind, o);
            }
        }
        Step::Apply(o) => add(objects, kind, o),
        Step::Delete(o) => {
            if let Some((ns, name)) = o.names() {
                objects.remove(&(kind, key(ns, name)));
            }
        }
        Step::Progress => {}
        Step::Failed(f) => {
            tracing::debug!(object = kind.object(), error = %f.text, "uplink hints: a list or watch failed");
        }
    }
    *objects != before
}

fn key(ns: &str, name: &str) -> String {
    if ns.is_empty() {
        name.to_owned()
    } else {
        format!("{ns}/{name}")
    }
}

/// Add (or replace) one object's named interfaces; one without any names
/// none (MetalLB's default: every interface, which says nothing of which).
fn add(objects: &mut BTreeMap<(Kind, String), Named>, kind: Kind, o: Obj<Announcement>) {
    let Obj::Good(a) = o else {
        return;
    };
    let name = key(
        a.metadata.namespace.as_deref().unwrap_or_default(),
        a.metadata.name.as_deref().unwrap_or_default(),
    );
    let rules = a.rules(kind);
    if rules.is_empty() {
        objects.remove(&(kind, name));
        return;
    }
    if objects.len() >= MAX_OBJECTS && !objects.contains_key(&(kind, name.clone())) {
        tracing::warn!(
            object = kind.object(),
            name,
            "uplink hints: more than {MAX_OBJECTS} objects name interfaces; this one is not read"
        );
        return;
    }
    let by = format!("{} {name}", kind.object());
    objects.insert((kind, name), Named { by, rules });
}

/// An L2Advertisement or a CiliumL2AnnouncementPolicy: both keep the
/// interfaces in `spec.interfaces`.
#[derive(Debug, Clone, Deserialize)]
struct Announcement {
    metadata: Meta,
    #[serde(default)]
    spec: Option<AnnouncementSpec>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct AnnouncementSpec {
    #[serde(default)]
    interfaces: Option<Vec<String>>,
}

impl Object for Announcement {
    fn meta(&self) -> &Meta {
        &self.metadata
    }
}

impl Announcement {
    fn rules(&self, kind: Kind) -> Vec<NameRule> {
        let names = (self.spec.as_ref().and_then(|s| s.interfaces.as_ref()))
            .map(Vec::as_slice)
            .unwrap_or_default();
        names
            .iter()
            .take(MAX_RULES)
            .filter_map(|n| match kind {
                Kind::MetalLb => Some(NameRule::Exact(n.clone())),
                Kind::Cilium => match regex::RegexBuilder::new(n).size_limit(REGEX_SIZE).build() {
                    Ok(r) => Some(NameRule::Regex(r)),
                    Err(e) => {
                        tracing::warn!(object = kind.object(), name = ?self.metadata.name, pattern = %n, error = %e, "uplink hints: an interfaces pattern that is not a regular expression is skipped");
                        None
                    }
                },
            })
            .collect()
    }
}

/// Follow one collection; a kind the API does not serve (404) or this
/// guard may not read (403) is let go and asked again after
/// [`ABSENT_RETRY`], once said.
async fn keep_following(
    kind: Kind,
    client: Client,
    dialer: Dialer,
    path: String,
    out: mpsc::Sender<(Kind, Step<Announcement>)>,
) {
    let mut said = false;
    loop {
        let (tx, mut rx) = mpsc::channel(16);
        let c = Collection {
            client: client.clone(),
            dialer: dialer.clone(),
            path: path.clone(),
            labels: String::new(),
        };
        let follower = tokio::spawn(follow::follow(c, tx));
        let absent = loop {
            let Some(step) = rx.recv().await else {
                break None;
            };
            if let Step::Failed(f) = &step {
                if let Some(code @ (403 | 404)) = f.code {
                    break Some(code);
                }
            }
            if out.send((kind, step)).await.is_err() {
                follower.abort();
                return;
            }
        };
        follower.abort();
        if let Some(code) = absent.filter(|_| !said) {
            said = true;
            let why = if code == 404 {
                "not served (no such CRD)"
            } else {
                "not readable (RBAC)"
            };
            tracing::info!(
                object = kind.object(),
                code,
                "uplink hints: {}s {why}; asked again every {ABSENT_RETRY:?}",
                kind.object()
            );
        }
        tokio::time::sleep(ABSENT_RETRY).await;
    }
}

/// The Node's InternalIP and ExternalIP addresses, retried until read
/// (every [`ABSENT_RETRY`] while refused or not found, else with back-off).
async fn node_ips(client: Client, node: String) -> Vec<std::net::IpAddr> {
    let mut attempt = 0;
    loop {
        match read_node(&client, &node).await {
            Ok(ips) => return ips,
            Err((code, e)) => {
                if attempt == 0 {
                    tracing::info!(node = %node, error = %e, "uplink hints: cannot read the Node yet; retrying (the routes choose meanwhile)");
                }
                let wait = match code {
                    Some(403 | 404) => ABSENT_RETRY,
                    _ => backoff(NODE_RETRY, attempt),
                };
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
        }
    }
}

#[derive(Deserialize)]
struct Node {
    #[serde(default)]
    status: Option<NodeStatus>,
}

#[derive(Deserialize)]
struct NodeStatus {
    #[serde(default)]
    addresses: Vec<NodeAddress>,
}

#[derive(Deserialize)]
struct NodeAddress {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    address: String,
}

/// The Node's addresses; Err: the API's status code if it gave one, and why.
async fn read_node(
    client: &Client,
    node: &str,
) -> Result<Vec<std::net::IpAddr>, (Option<u16>, String)> {
    // resourceVersion=0: from the API server's cache, not a quorum read.
    let req = http::Request::get(format!("/api/v1/nodes/{node}?resourceVersion=0"))
        .body(Vec::new())
        .map_err(|e| (None, e.to_string()))?;
    let text = tokio::time::timeout(NODE_TIMEOUT, client.request_text(req))
        .await
        .map_err(|_| (None, format!("no answer within {NODE_TIMEOUT:?}")))?
        .map_err(|e| match &e {
            kube::Error::Api(s) => (Some(s.code), e.to_string()),
            _ => (None, e.to_string()),
        })?;
    let n: Node = serde_json::from_str(&text).map_err(|e| (None, format!("not a Node: {e}")))?;
    Ok(node_addresses(n))
}

fn node_addresses(n: Node) -> Vec<std::net::IpAddr> {
    let mut ips: Vec<std::net::IpAddr> = (n.status.into_iter())
        .flat_map(|s| s.addresses)
        .filter(|a| a.kind == "InternalIP" || a.kind == "ExternalIP")
        .filter_map(|a| a.address.parse().ok())
        .collect();
    ips.sort_unstable();
    ips.dedup();
    ips
}

#[cfg(test)]
mod tests {
    use super::*;

    fn announcement(json: &str) -> Obj<Announcement> {
        Obj::Good(serde_json::from_str(json).unwrap())
    }

    #[test]
    fn objects_name_interfaces_until_they_are_deleted() {
        let mut objects = BTreeMap::new();
        let l2 = r#"{"metadata":{"name":"lan","namespace":"metallb-system","resourceVersion":"1"},
                     "spec":{"interfaces":["eno1","bond0"],"ipAddressPools":["a"]}}"#;
        assert!(apply(
            &mut objects,
            Kind::MetalLb,
            Step::Listed(vec![announcement(l2)])
        ));
        let named: Vec<&Named> = objects.values().collect();
        assert_eq!(named[0].by, "L2Advertisement metallb-system/lan");
        assert!(named[0].rules.iter().any(|r| r.matches("bond0")));
        assert!(
            !named[0].rules.iter().any(|r| r.matches("bond0.100")),
            "exact names"
        );
        let policy = r#"{"metadata":{"name":"p"},"spec":{"interfaces":["^eth[0-9]+","(bad"]}}"#;
        assert!(apply(
            &mut objects,
            Kind::Cilium,
            Step::Apply(announcement(policy))
        ));
        let p = &objects[&(Kind::Cilium, "p".to_owned())];
        assert_eq!(p.rules.len(), 1, "the invalid pattern is skipped");
        assert!(p.rules[0].matches("eth12"));
        // Unchanged: no news.
        assert!(!apply(
            &mut objects,
            Kind::Cilium,
            Step::Apply(announcement(policy))
        ));
        // Without interfaces: every interface, which names none.
        let every = r#"{"metadata":{"name":"p"},"spec":{}}"#;
        assert!(apply(
            &mut objects,
            Kind::Cilium,
            Step::Apply(announcement(every))
        ));
        assert_eq!(objects.len(), 1);
        assert!(apply(
            &mut objects,
            Kind::MetalLb,
            Step::Delete(announcement(l2))
        ));
        assert!(objects.is_empty());
    }

    #[test]
    fn the_node_s_internal_and_external_addresses() {
        let n: Node = serde_json::from_str(
            r#"{"status":{"addresses":[{"type":"Hostname","address":"node-a"},
                {"type":"InternalIP","address":"198.51.100.2"},{"type":"InternalIP","address":"fd00::2"},
                {"type":"ExternalIP","address":"203.0.113.2"},{"type":"InternalIP","address":"junk"}]}}"#,
        )
        .unwrap();
        let ips: Vec<String> = node_addresses(n).iter().map(|i| i.to_string()).collect();
        assert_eq!(ips, ["198.51.100.2", "203.0.113.2", "fd00::2"]);
    }
}
