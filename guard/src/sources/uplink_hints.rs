//! What the cluster says of this node's uplinks, for `--interface auto`:
//! the Node's InternalIP and ExternalIP (`own_node`: read once), and the
//! interfaces the announcers' own objects name: MetalLB's L2Advertisements
//! (`interfaces`, names) and Cilium's CiliumL2AnnouncementPolicies
//! (`interfaces`, regular expressions), each followed with one watch.
//!
//! Node selectors are not read: the kernel of a node that does not announce
//! still answers ARP on every interface (the flux this guard stops), so an
//! interface an announcer names is guarded on every node.
//!
//! None of this is needed to guard: until it answers, the routes decide
//! alone, and a kind the cluster does not have (its CRD missing, 404) or
//! this guard may not read (403) is asked again only every
//! [`ABSENT_RETRY`]. At rest this costs one watch request per follower per
//! watch timeout (`--kube-watch-timeout`: [5, 10) minutes).

use std::{collections::BTreeMap, time::Duration};

use kube::Client;
use serde::Deserialize;
use tokio::sync::{mpsc, watch};

use crate::{
    model::uplinks::{Hints, NameRule, Named},
    sources::{
        cluster::{
            decode::{Meta, Obj, Object},
            dial::Dialer,
        },
        own_node::OwnNode,
        presence::follow::{self, Collection, Step},
    },
};

/// A kind the API does not serve here, or may not be read, is asked again
/// after this long.
const ABSENT_RETRY: Duration = crate::sources::own_node::REFUSED_RETRY;
/// Objects of one kind taken at most, and interface rules per object: an
/// operator's objects, not an attacker's, but bounded all the same.
const MAX_OBJECTS: usize = 256;
const MAX_RULES: usize = 64;
/// Compiled size of one regular expression at most.
const REGEX_SIZE: usize = 1 << 20;

/// Which objects to follow.
#[derive(Debug, Clone)]
pub struct HintsConfig {
    /// MetalLB's namespace (its L2Advertisements), when MetalLB announces.
    pub metallb: Option<String>,
    /// Cilium announces (its cluster-wide policies).
    pub cilium: bool,
    /// Each watch asks for a random time in [this, twice this)
    /// (`--kube-watch-timeout`).
    pub watch_min: Duration,
}

/// Start following with `client` and `dialer`; `node` is this guard's Node
/// as `own_node` reads it. The hints are published on the returned channel.
pub fn spawn(
    cfg: HintsConfig,
    client: Client,
    dialer: Dialer,
    node: watch::Receiver<Option<OwnNode>>,
) -> watch::Receiver<Hints> {
    let (tx, rx) = watch::channel(Hints::default());
    tokio::spawn(run(cfg, client, dialer, node, tx));
    rx
}

async fn run(
    cfg: HintsConfig,
    client: Client,
    dialer: Dialer,
    mut node: watch::Receiver<Option<OwnNode>>,
    tx: watch::Sender<Hints>,
) {
    let (steps_tx, mut steps) = mpsc::channel::<(Kind, Step<Announcement>)>(64);
    if let Some(ns) = &cfg.metallb {
        let path = format!("/apis/metallb.io/v1beta1/namespaces/{ns}/l2advertisements");
        tokio::spawn(keep_following(
            Kind::MetalLb,
            (client.clone(), dialer.clone(), cfg.watch_min),
            path,
            steps_tx.clone(),
        ));
    }
    if cfg.cilium {
        let path = "/apis/cilium.io/v2alpha1/ciliuml2announcementpolicies".to_owned();
        tokio::spawn(keep_following(
            Kind::Cilium,
            (client.clone(), dialer, cfg.watch_min),
            path,
            steps_tx.clone(),
        ));
    }
    drop(steps_tx);
    let mut objects: BTreeMap<(Kind, String), Named> = BTreeMap::new();
    let (mut node_open, mut steps_open) = (true, true);
    loop {
        if !node_open && !steps_open {
            // Nothing more to follow: held open, the daemon keeps the hints.
            tx.closed().await;
            return;
        }
        tokio::select! {
            r = node.changed(), if node_open => {
                let ips = node.borrow_and_update().as_ref().map(|n| n.addresses.clone());
                match (r, ips) {
                    (Err(_), _) => node_open = false,
                    (Ok(()), Some(ips)) => tx.send_modify(|h| h.node_ips = Some(ips)),
                    (Ok(()), None) => {}
                }
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
    (client, dialer, watch_min): (Client, Dialer, Duration),
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
            watch_min,
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
}
