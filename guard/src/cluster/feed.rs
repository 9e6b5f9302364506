//! The ownership feed from the Kubernetes API: watchers on Services, Leases
//! and ServiceL2Status objects keep a [`Model`], and every change (and every
//! lease expiry) publishes the claims it implies.
//!
//! Health is tracked per stream. A stream is failing from its first error
//! until it delivers again; a probe (a one-item list, bounded by a timeout)
//! catches an API that went silent. Once anything has been failing for
//! longer than the staleness threshold, the published view is `degraded` and
//! the daemon treats every `foreign` IP as `unknown`: knowledge that may be
//! stale must not keep blocking a node's speaker. When the probe succeeds
//! again while streams are still failing, the streams are rebuilt, which
//! relists everything: the feed is fresh only once every stream has synced.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    pin::Pin,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use futures::{Stream, StreamExt as _};
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Service};
use kube::{
    api::{ApiResource, DynamicObject, GroupVersionKind, ListParams},
    runtime::{watcher, WatchStreamExt as _},
    Api, Client,
};
use tokio::sync::watch;

use super::{
    model::{Announcer, Claim, Key, L2Status, Model, ServiceInfo},
    objects::{self, ServiceFilter},
};

#[derive(Debug, Clone)]
pub struct FeedConfig {
    pub announcers: Vec<Announcer>,
    pub filter: ServiceFilter,
    /// Label selector for Services (server-side).
    pub selector: Option<String>,
    /// Degrade after this long without a healthy feed; None: the longest
    /// duration of the Leases in use, at least 15 s.
    pub stale_after: Option<Duration>,
}

/// What the cluster says, as published to the daemon.
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    /// Empty until every stream has completed its first list, so that an
    /// announcer that lists late cannot be overruled by one that listed early.
    pub claims: BTreeMap<IpAddr, Claim>,
    /// Every watcher has completed its first list.
    pub synced: bool,
    /// The API has been unreachable for longer than the threshold.
    pub degraded: bool,
    /// Every holder of a Lease in use and every announcing node (to spot a
    /// node name that matches none of them).
    pub holders: BTreeSet<String>,
    /// When the change that produced this view reached the guard.
    pub event_at: Option<Instant>,
    /// Since when the feed has been failing (None: healthy).
    pub failing_since: Option<Instant>,
}

impl PartialEq for ClusterView {
    fn eq(&self, o: &Self) -> bool {
        self.claims == o.claims
            && self.synced == o.synced
            && self.degraded == o.degraded
            && self.holders == o.holders
    }
}

/// Build a client from `kubeconfig`, else the usual inference (in-cluster
/// service account, then $KUBECONFIG / ~/.kube/config).
pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<Client> {
    // Several rustls providers could be compiled in; name ours. An error only
    // means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .context("kubeconfig")?
        }
        None => kube::Config::infer()
            .await
            .context("no Kubernetes API configuration (in-cluster or kubeconfig)")?,
    };
    // A silently dead connection must surface as an error: watches end after
    // WATCH_TIMEOUT_S on their own, so a longer read gap means trouble.
    config.read_timeout = Some(Duration::from_secs(WATCH_TIMEOUT_S as u64 + 15));
    Client::try_from(config).context("building the Kubernetes client")
}

pub fn l2status_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("metallb.io", "v1beta1", "ServiceL2Status"),
        "servicel2statuses",
    )
}

/// Server-side end of each watch; the watcher then resumes from its last
/// resourceVersion (bookmarks keep it fresh, so that rarely needs a relist).
const WATCH_TIMEOUT_S: u32 = 55;
const PROBE_EVERY: Duration = Duration::from_secs(2);
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// A stream failing this long while the API answers is rebuilt (relisted).
const REBUILD_AFTER: Duration = Duration::from_secs(5);
/// Node heartbeats: thousands of renewals a minute on a big cluster, never an announcer's.
const NODE_LEASES_NS: &str = "kube-node-lease";

enum Update {
    Svc(Box<watcher::Event<Service>>),
    Lease(watcher::Event<Lease>),
    L2(watcher::Event<DynamicObject>),
}

/// Items of all streams, tagged with the stream's index.
type Updates = Pin<Box<dyn Stream<Item = (usize, Result<Update, watcher::Error>)> + Send>>;

/// What one stream watches, for names in logs and for relist bookkeeping.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Services,
    Leases,
    L2 { namespace: String },
}

impl Source {
    fn name(&self) -> String {
        match self {
            Source::Services => "services".into(),
            Source::Leases => "leases".into(),
            Source::L2 { namespace } => format!("servicel2statuses in {namespace}"),
        }
    }
}

/// The streams the announcers need.
fn sources(cfg: &FeedConfig) -> Vec<Source> {
    let mut out = vec![Source::Services];
    if cfg
        .announcers
        .iter()
        .any(|a| !matches!(a, Announcer::MetalLb { .. }))
    {
        out.push(Source::Leases);
    }
    for a in &cfg.announcers {
        if let Announcer::MetalLb { namespace } = a {
            out.push(Source::L2 {
                namespace: namespace.clone(),
            });
        }
    }
    out
}

/// Where Leases are watched: one namespace when every Lease-based announcer
/// points into the same one, else cluster-wide (kube-vip's per-service Leases
/// live in each Service's namespace) without the node heartbeats.
fn lease_api(client: &Client, cfg: &FeedConfig) -> (Api<Lease>, watcher::Config) {
    let config = watcher::Config::default().timeout(WATCH_TIMEOUT_S);
    let namespaces: BTreeSet<Option<&str>> = cfg
        .announcers
        .iter()
        .filter_map(|a| match a {
            Announcer::Cilium { namespace } => Some(Some(namespace.as_str())),
            Announcer::KubeVipGlobal { lease } => Some(Some(lease.ns.as_str())),
            Announcer::KubeVipPerService => Some(None),
            Announcer::MetalLb { .. } => None,
        })
        .collect();
    match namespaces.iter().collect::<Vec<_>>().as_slice() {
        [Some(ns)] => (Api::namespaced(client.clone(), ns), config),
        _ => (
            Api::all(client.clone()),
            config.fields(&format!("metadata.namespace!={NODE_LEASES_NS}")),
        ),
    }
}

fn streams(client: &Client, cfg: &FeedConfig, sources: &[Source]) -> Updates {
    let base = || watcher::Config::default().timeout(WATCH_TIMEOUT_S);
    let all: Vec<Updates> = sources
        .iter()
        .enumerate()
        .map(|(i, src)| -> Updates {
            match src {
                Source::Services => {
                    let mut c = base();
                    if let Some(sel) = &cfg.selector {
                        c = c.labels(sel);
                    }
                    let s = watcher(Api::<Service>::all(client.clone()), c).default_backoff();
                    Box::pin(s.map(move |r| (i, r.map(|e| Update::Svc(Box::new(e))))))
                }
                Source::Leases => {
                    let (api, c) = lease_api(client, cfg);
                    Box::pin(
                        watcher(api, c)
                            .default_backoff()
                            .map(move |r| (i, r.map(Update::Lease))),
                    )
                }
                Source::L2 { namespace } => {
                    let api = Api::<DynamicObject>::namespaced_with(
                        client.clone(),
                        namespace,
                        &l2status_resource(),
                    );
                    Box::pin(
                        watcher(api, base())
                            .default_backoff()
                            .map(move |r| (i, r.map(Update::L2))),
                    )
                }
            }
        })
        .collect();
    Box::pin(futures::stream::select_all(all))
}

/// A stream's relist in progress: objects since `Init`, swapped in at `InitDone`.
enum Relist {
    Services(BTreeMap<Key, ServiceInfo>),
    Leases(BTreeMap<Key, (Option<String>, Duration, Option<String>)>),
    L2(BTreeMap<Key, L2Status>),
}

pub(crate) struct Feed {
    cfg: FeedConfig,
    sources: Vec<Source>,
    pub(crate) model: Model,
    relists: BTreeMap<usize, Relist>,
    /// Streams that completed their first list.
    synced: BTreeSet<usize>,
    /// Stream index (or `usize::MAX` for the probe) -> failing since.
    failing: BTreeMap<usize, Instant>,
    last_error: Option<String>,
}

const PROBE: usize = usize::MAX;

impl Feed {
    pub(crate) fn new(cfg: FeedConfig) -> Self {
        let sources = sources(&cfg);
        Feed {
            cfg,
            sources,
            model: Model::default(),
            relists: BTreeMap::new(),
            synced: BTreeSet::new(),
            failing: BTreeMap::new(),
            last_error: None,
        }
    }

    fn apply(&mut self, stream: usize, upd: Update, now: Instant) {
        use watcher::Event::*;
        let filter = &self.cfg.filter;
        match upd {
            Update::Svc(ev) => match *ev {
                Apply(s) => match objects::service(&s, filter) {
                    Some(info) => {
                        self.model.services.insert(objects::key_of(&s), info);
                    }
                    None => {
                        self.model.services.remove(&objects::key_of(&s));
                    }
                },
                Delete(s) => {
                    self.model.services.remove(&objects::key_of(&s));
                }
                Init => {
                    self.relists
                        .insert(stream, Relist::Services(BTreeMap::new()));
                }
                InitApply(s) => {
                    if let (Some(Relist::Services(b)), Some(info)) =
                        (self.relists.get_mut(&stream), objects::service(&s, filter))
                    {
                        b.insert(objects::key_of(&s), info);
                    }
                }
                InitDone => {
                    if let Some(Relist::Services(b)) = self.relists.remove(&stream) {
                        self.model.services = b;
                    }
                    self.synced.insert(stream);
                }
            },
            Update::Lease(ev) => match ev {
                Apply(l) => {
                    let (h, d, r) = objects::lease(&l);
                    self.model.upsert_lease(objects::key_of(&l), h, d, r, now);
                }
                Delete(l) => {
                    self.model.leases.remove(&objects::key_of(&l));
                }
                Init => {
                    self.relists.insert(stream, Relist::Leases(BTreeMap::new()));
                }
                InitApply(l) => {
                    if let Some(Relist::Leases(b)) = self.relists.get_mut(&stream) {
                        b.insert(objects::key_of(&l), objects::lease(&l));
                    }
                }
                InitDone => {
                    if let Some(Relist::Leases(listed)) = self.relists.remove(&stream) {
                        // upsert_lease keeps the observation time of a Lease
                        // whose holder and renewTime did not change: a relist
                        // never extends a lease that stopped being renewed.
                        self.model.leases.retain(|k, _| listed.contains_key(k));
                        for (k, (h, d, r)) in listed {
                            self.model.upsert_lease(k, h, d, r, now);
                        }
                    }
                    self.synced.insert(stream);
                }
            },
            Update::L2(ev) => match ev {
                Apply(o) => match objects::l2status(&o) {
                    Some(s) => {
                        self.model.l2.insert(objects::key_of(&o), s);
                    }
                    None => {
                        self.model.l2.remove(&objects::key_of(&o));
                    }
                },
                Delete(o) => {
                    self.model.l2.remove(&objects::key_of(&o));
                }
                Init => {
                    self.relists.insert(stream, Relist::L2(BTreeMap::new()));
                }
                InitApply(o) => {
                    if let (Some(Relist::L2(b)), Some(s)) =
                        (self.relists.get_mut(&stream), objects::l2status(&o))
                    {
                        b.insert(objects::key_of(&o), s);
                    }
                }
                InitDone => {
                    if let (Some(Relist::L2(b)), Some(Source::L2 { namespace })) =
                        (self.relists.remove(&stream), self.sources.get(stream))
                    {
                        // This stream owns its namespace's entries only.
                        self.model.l2.retain(|k, _| &k.ns != namespace);
                        self.model.l2.extend(b);
                    }
                    self.synced.insert(stream);
                }
            },
        }
    }

    fn threshold(&self) -> Duration {
        self.cfg.stale_after.unwrap_or_else(|| {
            self.model
                .max_lease_duration(&self.cfg.announcers)
                .unwrap_or_default()
                .max(Duration::from_secs(15))
        })
    }

    fn failing_since(&self) -> Option<Instant> {
        self.failing.values().min().copied()
    }

    fn degraded(&self, now: Instant) -> bool {
        self.failing_since()
            .is_some_and(|t| now.duration_since(t) >= self.threshold())
    }

    fn synced(&self) -> bool {
        self.synced.len() >= self.sources.len()
    }

    pub(crate) fn view(&self, now: Instant, event_at: Option<Instant>) -> ClusterView {
        let synced = self.synced();
        ClusterView {
            claims: if synced {
                self.model.ownership(&self.cfg.announcers, now)
            } else {
                BTreeMap::new()
            },
            synced,
            degraded: self.degraded(now),
            holders: self
                .model
                .named_nodes(&self.cfg.announcers)
                .into_iter()
                .map(str::to_owned)
                .collect(),
            event_at,
            failing_since: self.failing_since(),
        }
    }

    fn ok(&mut self, who: usize) {
        if self.failing.remove(&who).is_some() && self.failing.is_empty() {
            tracing::info!("Kubernetes API feed healthy again");
        }
    }

    fn failed(&mut self, who: usize, e: &dyn std::fmt::Display, now: Instant) {
        let name = self
            .sources
            .get(who)
            .map_or_else(|| "probe".to_owned(), Source::name);
        let msg = format!("{name}: {e}");
        if self.failing.is_empty() {
            tracing::warn!(error = %msg, "Kubernetes API feed failing; keeping the last known ownership for now");
        } else if self.last_error.as_deref() != Some(msg.as_str()) {
            tracing::debug!(error = %msg, "feed still failing");
        }
        self.failing.entry(who).or_insert(now);
        self.last_error = Some(msg);
    }

    fn handle(&mut self, stream: usize, item: Result<Update, watcher::Error>, now: Instant) {
        let name = self
            .sources
            .get(stream)
            .map_or_else(|| "probe".to_owned(), Source::name);
        match item {
            Ok(u) => {
                crate::api::OPS.feed_event(&name);
                self.ok(stream);
                self.apply(stream, u, now);
            }
            Err(e) => {
                crate::api::OPS.error("kubernetes_feed");
                self.failed(stream, &e, now)
            }
        }
    }
}

/// Run the feed for the life of the daemon, publishing into `tx`.
pub async fn run(client: Client, cfg: FeedConfig, tx: watch::Sender<ClusterView>) {
    let mut feed = Feed::new(cfg.clone());
    let mut updates = streams(&client, &cfg, &feed.sources);
    let probe_api = Api::<Service>::all(client.clone());
    let mut next_probe = Instant::now() + PROBE_EVERY;
    let mut was_degraded = false;
    let mut announced_sync = false;
    let mut last_rebuild = Instant::now();
    loop {
        let now = Instant::now();
        // The probe is always due at `next_probe`, even if overdue; expiry
        // and degrade deadlines only matter while they are ahead.
        let later = [
            feed.model.next_expiry(now),
            feed.failing_since().map(|t| t + feed.threshold()),
        ];
        let wake = later
            .into_iter()
            .flatten()
            .filter(|t| *t > now)
            .fold(next_probe, Instant::min);
        let mut event_at = None;
        tokio::select! {
            item = updates.next() => {
                let Some((stream, item)) = item else {
                    tracing::error!("Kubernetes watch streams ended; restarting them");
                    updates = streams(&client, &cfg, &feed.sources);
                    continue;
                };
                let t = Instant::now();
                event_at = Some(t);
                feed.handle(stream, item, t);
                // Batch what is already waiting: one map update per burst.
                while let Some(Some((stream, item))) = futures::FutureExt::now_or_never(updates.next()) {
                    feed.handle(stream, item, Instant::now());
                }
            }
            _ = tokio::time::sleep_until(wake.into()) => {}
        }
        if Instant::now() >= next_probe {
            let probe = tokio::time::timeout(
                PROBE_TIMEOUT,
                probe_api.list_metadata(&ListParams::default().limit(1)),
            )
            .await;
            let now = Instant::now();
            match probe {
                Ok(Ok(_)) => {
                    feed.ok(PROBE);
                    // The API answers but a stream has not delivered since its
                    // error for a while (a resumed watch says nothing until
                    // something changes, or it waits in backoff): rebuild the
                    // streams, which relists everything and proves them fresh.
                    let stuck = feed
                        .failing_since()
                        .is_some_and(|t| now.duration_since(t) >= REBUILD_AFTER);
                    if stuck && now.duration_since(last_rebuild) >= REBUILD_AFTER {
                        tracing::info!("Kubernetes API answers again; relisting");
                        updates = streams(&client, &cfg, &feed.sources);
                        last_rebuild = now;
                    }
                }
                Ok(Err(e)) => feed.failed(PROBE, &e, now),
                Err(_) => feed.failed(PROBE, &format!("no answer within {PROBE_TIMEOUT:?}"), now),
            }
            next_probe = now + PROBE_EVERY;
        }
        let view = feed.view(Instant::now(), event_at);
        if view.degraded != was_degraded {
            was_degraded = view.degraded;
            if view.degraded {
                tracing::warn!(
                    after = ?feed.threshold(),
                    error = feed.last_error.as_deref().unwrap_or(""),
                    "ownership feed stale: every foreign LB IP is treated as unknown until the API is back"
                );
            } else {
                tracing::info!("ownership feed fresh again: foreign LB IPs are enforced again");
            }
        }
        if view.synced && !announced_sync {
            announced_sync = true;
            tracing::info!(
                services = feed.model.services.len(),
                leases = feed.model.leases.len(),
                l2statuses = feed.model.l2.len(),
                "initial sync from the Kubernetes API done"
            );
        }
        tx.send_if_modified(|cur| {
            if *cur == view {
                return false;
            }
            *cur = view;
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease_json(holder: &str, renew: &str) -> Lease {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cilium-l2announce-default-web", "namespace": "kube-system"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 10, "renewTime": renew}
        }))
        .unwrap()
    }

    fn svc() -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "LoadBalancer"},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.10"}]}}
        }))
        .unwrap()
    }

    fn feed() -> Feed {
        Feed::new(FeedConfig {
            announcers: vec![Announcer::Cilium {
                namespace: "kube-system".into(),
            }],
            filter: ServiceFilter::default(),
            selector: None,
            stale_after: None,
        })
    }

    fn list(f: &mut Feed, t: Instant, lease: Lease) {
        use watcher::Event::*;
        f.apply(0, Update::Svc(Box::new(Init)), t);
        f.apply(0, Update::Svc(Box::new(InitApply(svc()))), t);
        f.apply(0, Update::Svc(Box::new(InitDone)), t);
        f.apply(1, Update::Lease(Init), t);
        f.apply(1, Update::Lease(InitApply(lease)), t);
        f.apply(1, Update::Lease(InitDone), t);
    }

    #[test]
    fn a_relist_does_not_extend_a_lease_nobody_renews() {
        let t0 = Instant::now();
        let mut f = feed();
        assert!(
            f.view(t0, None).claims.is_empty(),
            "nothing before the first sync"
        );
        list(
            &mut f,
            t0,
            lease_json("node-a", "2026-11-30T10:00:00.000000Z"),
        );
        let ip: IpAddr = "198.51.100.10".parse().unwrap();
        assert_eq!(
            f.view(t0, None).claims[&ip].owner.as_deref(),
            Some("node-a")
        );
        // A relist 8 s later with the same renewTime keeps the first observation...
        list(
            &mut f,
            t0 + Duration::from_secs(8),
            lease_json("node-a", "2026-11-30T10:00:00.000000Z"),
        );
        assert_eq!(
            f.view(t0 + Duration::from_secs(11), None).claims[&ip].owner,
            None,
            "expired 10 s after it was first seen"
        );
        // ...and a renewal seen in a relist counts as one.
        list(
            &mut f,
            t0 + Duration::from_secs(12),
            lease_json("node-a", "2026-11-30T10:00:12.000000Z"),
        );
        assert_eq!(
            f.view(t0 + Duration::from_secs(13), None).claims[&ip]
                .owner
                .as_deref(),
            Some("node-a")
        );
    }

    #[test]
    fn claims_wait_for_every_stream() {
        use watcher::Event::*;
        let t0 = Instant::now();
        let mut f = feed();
        f.apply(0, Update::Svc(Box::new(Init)), t0);
        f.apply(0, Update::Svc(Box::new(InitApply(svc()))), t0);
        f.apply(0, Update::Svc(Box::new(InitDone)), t0);
        let v = f.view(t0, None);
        assert!(!v.synced && v.claims.is_empty(), "Leases not listed yet");
    }

    #[test]
    fn degrades_after_the_threshold_and_recovers_per_stream() {
        let t0 = Instant::now();
        let mut f = feed();
        list(
            &mut f,
            t0,
            lease_json("node-a", "2026-11-30T10:00:00.000000Z"),
        );
        f.failed(1, &"connection refused", t0);
        assert!(!f.view(t0 + Duration::from_secs(14), None).degraded);
        assert!(
            f.view(t0 + Duration::from_secs(15), None).degraded,
            "15 s floor"
        );
        // The probe answering does not vouch for the lease stream.
        f.ok(PROBE);
        assert!(f.view(t0 + Duration::from_secs(16), None).degraded);
        f.ok(1);
        assert!(!f.view(t0 + Duration::from_secs(16), None).degraded);
    }
}
