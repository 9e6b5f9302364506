//! What the API server alone tells the plugin, each read once (not per
//! node), from the API server's cache (`resourceVersion=0`): the guard Pods,
//! their presence records, the cluster's Nodes, the LoadBalancer Services
//! and arp-guard's Events. A read the plugin's user may not do is one error
//! that names the verb and the resource.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::Duration,
};

use k8s_openapi::api::{
    coordination::v1::Lease, core::v1::Pod, core::v1::Service, events::v1::Event,
};
use kube::{
    api::{ListParams, ObjectList},
    Api, Client,
};
use serde::{Deserialize, Serialize};

use guard_wire::presence::{self, Record};

/// A request the plugin's user is not allowed to make: what to grant.
#[derive(Debug, thiserror::Error)]
#[error(
    "forbidden: {message}\n  kubectl arp-guard needs `{verb}` on {resource} ({scope}): {}",
    role_for(resource)
)]
pub struct Denied {
    pub verb: &'static str,
    pub resource: &'static str,
    pub scope: String,
    pub message: String,
}

/// Which role of deploy/components/kubectl-plugin grants `resource`.
fn role_for(resource: &str) -> &'static str {
    match resource {
        "pods/exec" | "leases" => {
            "the Role arp-guard-operator of deploy/components/kubectl-plugin grants it (exec: \
             explain, doctor, --live; not read-only); bind it to your user or group"
        }
        _ => {
            "the roles arp-guard-viewer of deploy/components/kubectl-plugin grant what it reads \
             (read-only); bind them to your user or group"
        }
    }
}

/// A failed read of the API (not a 403): the command could not ask.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct ReadFailed {
    pub what: String,
    #[source]
    pub source: kube::Error,
}

/// `e` as the error of `verb` on `resource` in `scope`.
pub fn denied_or(
    e: kube::Error,
    verb: &'static str,
    resource: &'static str,
    scope: &str,
) -> anyhow::Error {
    match e {
        kube::Error::Api(s) if s.code == 403 => Denied {
            verb,
            resource,
            scope: scope.to_owned(),
            message: s.message.clone(),
        }
        .into(),
        e => ReadFailed {
            what: format!("{verb} {resource} ({scope})"),
            source: e,
        }
        .into(),
    }
}

/// One node's guard Pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardPod {
    pub name: String,
    pub node: String,
    /// The Pod's Ready condition.
    pub ready: bool,
    /// The guard's container is running (else it cannot be asked).
    pub running: bool,
    /// Why not, when it is not running or not Ready (a waiting reason, the
    /// phase).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// The container's image, as the Pod runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The container to exec into.
    pub container: String,
}

/// An arp-guard Event on a Service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRow {
    /// `namespace/name` of the Service.
    pub service: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub reason: String,
    pub note: String,
    /// The node whose guard posted it.
    pub node: String,
    /// Times seen (a series counts its repeats).
    pub count: i32,
    /// Seconds since it was last seen.
    pub age_s: i64,
}

/// Everything read from the API server.
#[derive(Debug, Default)]
pub struct ClusterReads {
    /// Guard Pods by node.
    pub pods: BTreeMap<String, GuardPod>,
    /// Presence records by node.
    pub records: BTreeMap<String, Record>,
    /// Every node of the cluster (None: not read, with --node, or they
    /// could not be; the nodes without a guard Pod are then not listed).
    pub nodes: Option<BTreeSet<String>>,
    /// Why the Nodes could not be read.
    pub nodes_unread: Option<String>,
    /// `namespace/name` of each LB IP's Service.
    pub services: BTreeMap<IpAddr, String>,
    /// arp-guard's Events within the window, newest first.
    pub events: Vec<EventRow>,
}

/// How the reads are made.
pub struct Reader<'a> {
    pub client: &'a Client,
    pub namespace: &'a str,
    pub selector: &'a str,
    pub container: &'a str,
    pub timeout: Duration,
}

impl Reader<'_> {
    async fn list<K>(
        &self,
        api: Api<K>,
        lp: &ListParams,
        (resource, scope): (&'static str, &str),
    ) -> anyhow::Result<ObjectList<K>>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        match tokio::time::timeout(self.timeout, api.list(lp)).await {
            Ok(r) => r.map_err(|e| denied_or(e, "list", resource, scope)),
            Err(_) => anyhow::bail!(
                "list {resource} ({scope}): the API server did not answer within {:?}",
                self.timeout
            ),
        }
    }

    /// The guard Pods of the namespace, by node.
    pub async fn pods(&self) -> anyhow::Result<BTreeMap<String, GuardPod>> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), self.namespace);
        let lp = ListParams::default().labels(self.selector).match_any();
        let scope = format!("namespace {}", self.namespace);
        let list = self.list(api, &lp, ("pods", &scope)).await?;
        let mut out = BTreeMap::new();
        for p in list.items {
            if let Some(g) = guard_pod(&p, self.container) {
                // Two Pods on a node (a rollout): the running one.
                let keep = out
                    .get(&g.node)
                    .is_none_or(|o: &GuardPod| !o.running && g.running);
                if keep {
                    out.insert(g.node.clone(), g);
                }
            }
        }
        Ok(out)
    }

    /// The presence records of the namespace, by node (malformed ones are
    /// skipped: a record is a guard's word about itself, not needed to ask).
    pub async fn records(&self) -> anyhow::Result<BTreeMap<String, Record>> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), self.namespace);
        let sel = format!("{}={}", presence::LABEL, presence::LABEL_VALUE);
        let lp = ListParams::default().labels(&sel).match_any();
        let scope = format!("namespace {}", self.namespace);
        let list = self.list(api, &lp, ("leases", &scope)).await?;
        Ok((list.items.iter())
            .filter_map(|l| {
                let text = l.metadata.annotations.as_ref()?.get(presence::ANNOTATION);
                Record::decode(text.map(String::as_str)).ok()
            })
            .map(|r| (r.node.clone(), r))
            .collect())
    }

    /// The LB IPs and their Services (type LoadBalancer, filtered by the
    /// server where it can, before 1.31 here).
    pub async fn services(&self) -> anyhow::Result<BTreeMap<IpAddr, String>> {
        let api: Api<Service> = Api::all(self.client.clone());
        let lp = ListParams::default()
            .fields("spec.type=LoadBalancer")
            .match_any();
        let list = match self.list(api.clone(), &lp, ("services", "cluster")).await {
            Ok(l) => l,
            Err(e) if is_bad_selector(&e) => {
                let lp = ListParams::default().match_any();
                self.list(api, &lp, ("services", "cluster")).await?
            }
            Err(e) => return Err(e),
        };
        let mut out = BTreeMap::new();
        for s in list.items {
            let lb = s.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer");
            if !lb {
                continue;
            }
            let name = format!(
                "{}/{}",
                s.metadata.namespace.as_deref().unwrap_or_default(),
                s.metadata.name.as_deref().unwrap_or_default()
            );
            let ingress = (s.status.as_ref())
                .and_then(|st| st.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref());
            for i in ingress.into_iter().flatten() {
                if let Some(ip) = i.ip.as_deref().and_then(|ip| ip.parse().ok()) {
                    out.insert(ip, name.clone());
                }
            }
        }
        Ok(out)
    }

    /// arp-guard's Events seen within `since`, newest first (by the
    /// reporting controller; a server that cannot select by it is read in
    /// pages, at most [`EVENT_PAGES`] of them, and filtered here).
    pub async fn events(&self, since: Duration) -> anyhow::Result<Vec<EventRow>> {
        let api: Api<Event> = Api::all(self.client.clone());
        let lp = ListParams::default()
            .fields("reportingController=arp-guard")
            .match_any();
        let what = ("events.events.k8s.io", "cluster");
        let items = match self.list(api.clone(), &lp, what).await {
            Ok(l) => l.items,
            Err(e) if is_bad_selector(&e) => self.every_event(api).await?,
            Err(e) => return Err(e),
        };
        let now = jiff::Timestamp::now();
        let mut out: Vec<EventRow> = (items.iter())
            .filter(|e| e.reporting_controller.as_deref() == Some("arp-guard"))
            .filter_map(|e| event_row(e, now))
            .filter(|e| e.age_s <= since.as_secs() as i64)
            .collect();
        out.sort_by_key(|e| e.age_s);
        Ok(out)
    }
}

/// Pages of the cluster's Events read when the server cannot select
/// arp-guard's: 20 of 500, the first 10,000 (the API's cache serves no
/// pages, so these are etcd reads; bounded, and said when cut).
const EVENT_PAGES: usize = 20;
const EVENT_PAGE: u32 = 500;

impl Reader<'_> {
    async fn every_event(&self, api: Api<Event>) -> anyhow::Result<Vec<Event>> {
        let what = ("events.events.k8s.io", "cluster");
        let mut items = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..EVENT_PAGES {
            let mut lp = ListParams::default().limit(EVENT_PAGE);
            if let Some(t) = token.take() {
                lp = lp.continue_token(&t);
            }
            let page = self.list(api.clone(), &lp, what).await?;
            items.extend(page.items);
            token = page.metadata.continue_.filter(|t| !t.is_empty());
            if token.is_none() {
                return Ok(items);
            }
        }
        eprintln!(
            "note: the API server cannot select arp-guard's Events; {} of the cluster's were read (in the server's order, not the newest): some of arp-guard's may be missing",
            items.len()
        );
        Ok(items)
    }
}

/// The server refused a field selector (400): older servers and proxies.
fn is_bad_selector(e: &anyhow::Error) -> bool {
    matches!(e.downcast_ref::<ReadFailed>(), Some(ReadFailed { source: kube::Error::Api(s), .. }) if s.code == 400)
}

fn guard_pod(p: &Pod, container: &str) -> Option<GuardPod> {
    let node = p.spec.as_ref()?.node_name.clone()?;
    let st = p.status.as_ref();
    let ready = (st.and_then(|s| s.conditions.as_ref()))
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let statuses = st.and_then(|s| s.container_statuses.as_ref());
    let named = |n: &str| statuses.and_then(|cs| cs.iter().find(|c| c.name == n));
    // The guard's container, else the Pod's first.
    let first = (p.spec.as_ref())
        .and_then(|s| s.containers.first())
        .map(|c| c.name.clone());
    let name = if named(container).is_some()
        || (p.spec.as_ref()).is_some_and(|s| s.containers.iter().any(|c| c.name == container))
    {
        container.to_owned()
    } else {
        first.unwrap_or_else(|| container.to_owned())
    };
    let cs = named(&name);
    let state = cs.and_then(|c| c.state.as_ref());
    let running = state.is_some_and(|s| s.running.is_some());
    let waiting = (state.and_then(|s| s.waiting.as_ref())).and_then(|w| w.reason.clone());
    let phase = st
        .and_then(|s| s.phase.clone())
        .unwrap_or_else(|| "Unknown".into());
    let why = match (running, ready) {
        (true, true) => None,
        (true, false) => Some("not Ready".to_owned()),
        (false, _) => Some(waiting.unwrap_or(phase)),
    };
    Some(GuardPod {
        name: p.metadata.name.clone()?,
        node,
        ready,
        running,
        why,
        image: cs.map(|c| c.image.clone()),
        container: name,
    })
}

fn event_row(e: &Event, now: jiff::Timestamp) -> Option<EventRow> {
    let r = e.regarding.as_ref()?;
    if r.kind.as_deref() != Some("Service") {
        return None;
    }
    // The latest sighting: a series' last, else the event's own time.
    let last = (e.series.as_ref().map(|s| s.last_observed_time.0))
        .or(e.event_time.as_ref().map(|t| t.0))
        .or(e.deprecated_last_timestamp.as_ref().map(|t| t.0))
        .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0))?;
    let count = e.series.as_ref().map_or(1, |s| s.count.max(1));
    Some(EventRow {
        service: format!(
            "{}/{}",
            r.namespace.as_deref().unwrap_or_default(),
            r.name.as_deref().unwrap_or_default()
        ),
        kind: e.type_.clone().unwrap_or_default(),
        reason: e.reason.clone().unwrap_or_default(),
        note: e.note.clone().unwrap_or_default(),
        node: e.reporting_instance.clone().unwrap_or_default(),
        count,
        age_s: now.duration_since(last).as_secs().max(0),
    })
}
