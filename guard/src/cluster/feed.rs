//! The ownership feed from the Kubernetes API: watchers on Services, Leases
//! and ServiceL2Status objects keep a [`Model`], and every change (and every
//! lease expiry) publishes the claims it implies.
//!
//! Health: the feed is healthy while its watchers and a light probe succeed.
//! Once it has been failing for longer than the staleness threshold, the
//! published view is marked `degraded` and the daemon treats every `foreign`
//! IP as `unknown`: knowledge that may be stale must not keep blocking a
//! node's speaker.

use std::{
    collections::BTreeMap,
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
    model::{Announcer, Claim, Key, Model},
    objects::{self, ServiceFilter},
};

#[derive(Debug, Clone)]
pub struct FeedConfig {
    pub announcers: Vec<Announcer>,
    pub filter: ServiceFilter,
    /// Label selector for Services (server-side).
    pub selector: Option<String>,
    /// Degrade after this long without a healthy feed; None: the longest
    /// lease duration seen, at least 15 s.
    pub stale_after: Option<Duration>,
}

/// What the cluster says, as published to the daemon.
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    pub claims: BTreeMap<IpAddr, Claim>,
    /// Every watcher has completed its first list.
    pub synced: bool,
    /// The API has been unreachable for longer than the threshold.
    pub degraded: bool,
    /// Every lease holder and announcing node named in the cluster (to spot
    /// a node name that matches none of them).
    pub holders: std::collections::BTreeSet<String>,
    /// When the change that produced this view reached the guard.
    pub event_at: Option<Instant>,
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
    let config = match kubeconfig {
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
    Client::try_from(config).context("building the Kubernetes client")
}

pub fn l2status_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("metallb.io", "v1beta1", "ServiceL2Status"),
        "servicel2statuses",
    )
}

enum Update {
    Svc(Box<watcher::Event<Service>>),
    Lease(watcher::Event<Lease>),
    L2(watcher::Event<DynamicObject>),
}

type Updates = Pin<Box<dyn Stream<Item = (&'static str, Result<Update, watcher::Error>)> + Send>>;

/// Objects listed since the last `Init`, replacing the store at `InitDone`.
struct Relist<T> {
    buffer: Option<BTreeMap<Key, T>>,
}

impl<T> Default for Relist<T> {
    fn default() -> Self {
        Relist { buffer: None }
    }
}

fn watcher_config() -> watcher::Config {
    // Bookmarks keep resourceVersions fresh so reconnects rarely relist; a
    // bounded watch surfaces a silently dead connection within a minute.
    watcher::Config::default().timeout(55)
}

fn streams(client: &Client, cfg: &FeedConfig) -> Updates {
    let mut svc_cfg = watcher_config();
    if let Some(sel) = &cfg.selector {
        svc_cfg = svc_cfg.labels(sel);
    }
    let svc = watcher(Api::<Service>::all(client.clone()), svc_cfg)
        .default_backoff()
        .map(|r| ("services", r.map(|e| Update::Svc(Box::new(e)))));
    let mut all: Vec<Updates> = vec![Box::pin(svc)];
    let wants_leases = cfg
        .announcers
        .iter()
        .any(|a| !matches!(a, Announcer::MetalLb { .. }));
    if wants_leases {
        // Cluster-wide: kube-vip's per-service Leases live in each Service's namespace.
        let s = watcher(Api::<Lease>::all(client.clone()), watcher_config())
            .default_backoff()
            .map(|r| ("leases", r.map(Update::Lease)));
        all.push(Box::pin(s));
    }
    for a in &cfg.announcers {
        if let Announcer::MetalLb { namespace } = a {
            let api = Api::<DynamicObject>::namespaced_with(
                client.clone(),
                namespace,
                &l2status_resource(),
            );
            let s = watcher(api, watcher_config())
                .default_backoff()
                .map(|r| ("servicel2statuses", r.map(Update::L2)));
            all.push(Box::pin(s));
        }
    }
    Box::pin(futures::stream::select_all(all))
}

struct Feed {
    cfg: FeedConfig,
    model: Model,
    svc_relist: Relist<super::model::ServiceInfo>,
    lease_relist: Relist<(Option<String>, Duration, Option<String>)>,
    l2_relist: Relist<super::model::L2Status>,
    /// Streams that completed their first list.
    synced: std::collections::BTreeSet<&'static str>,
    expected: usize,
    failing_since: Option<Instant>,
    last_error: Option<String>,
}

impl Feed {
    fn apply(&mut self, upd: Update, now: Instant) {
        use watcher::Event::*;
        match upd {
            Update::Svc(ev) => match *ev {
                Apply(s) => {
                    match objects::service(&s, &self.cfg.filter) {
                        Some(info) => self.model.services.insert(objects::key_of(&s), info),
                        None => self.model.services.remove(&objects::key_of(&s)),
                    };
                }
                Delete(s) => {
                    self.model.services.remove(&objects::key_of(&s));
                }
                Init => self.svc_relist.buffer = Some(BTreeMap::new()),
                InitApply(s) => {
                    if let (Some(b), Some(info)) = (
                        self.svc_relist.buffer.as_mut(),
                        objects::service(&s, &self.cfg.filter),
                    ) {
                        b.insert(objects::key_of(&s), info);
                    }
                }
                InitDone => {
                    self.model.services = self.svc_relist.buffer.take().unwrap_or_default();
                    self.synced.insert("services");
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
                Init => self.lease_relist.buffer = Some(BTreeMap::new()),
                InitApply(l) => {
                    if let Some(b) = self.lease_relist.buffer.as_mut() {
                        b.insert(objects::key_of(&l), objects::lease(&l));
                    }
                }
                InitDone => {
                    let listed = self.lease_relist.buffer.take().unwrap_or_default();
                    // Keep observation times of leases that did not change.
                    self.model.leases.retain(|k, _| listed.contains_key(k));
                    for (k, (h, d, r)) in listed {
                        self.model.upsert_lease(k, h, d, r, now);
                    }
                    self.synced.insert("leases");
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
                Init => self.l2_relist.buffer = Some(BTreeMap::new()),
                InitApply(o) => {
                    if let (Some(b), Some(s)) =
                        (self.l2_relist.buffer.as_mut(), objects::l2status(&o))
                    {
                        b.insert(objects::key_of(&o), s);
                    }
                }
                InitDone => {
                    self.model.l2 = self.l2_relist.buffer.take().unwrap_or_default();
                    self.synced.insert("servicel2statuses");
                }
            },
        }
    }

    fn threshold(&self) -> Duration {
        self.cfg.stale_after.unwrap_or_else(|| {
            self.model
                .max_lease_duration()
                .unwrap_or_default()
                .max(Duration::from_secs(15))
        })
    }

    fn degraded(&self, now: Instant) -> bool {
        self.failing_since
            .is_some_and(|t| now.duration_since(t) >= self.threshold())
    }

    fn view(&self, now: Instant, event_at: Option<Instant>) -> ClusterView {
        ClusterView {
            claims: self.model.ownership(&self.cfg.announcers, now),
            synced: self.synced.len() >= self.expected,
            degraded: self.degraded(now),
            holders: self
                .model
                .named_nodes()
                .into_iter()
                .map(str::to_owned)
                .collect(),
            event_at,
        }
    }

    fn ok(&mut self) {
        if self.failing_since.take().is_some() {
            tracing::info!("Kubernetes API reachable again; the ownership feed is healthy");
        }
        self.last_error = None;
    }

    fn failed(&mut self, what: &str, e: &dyn std::fmt::Display, now: Instant) {
        let msg = format!("{what}: {e}");
        if self.failing_since.is_none() {
            tracing::warn!(error = %msg, "Kubernetes API feed failing; keeping the last known ownership for now");
            self.failing_since = Some(now);
        } else if self.last_error.as_deref() != Some(msg.as_str()) {
            tracing::debug!(error = %msg, "feed still failing");
        }
        self.last_error = Some(msg);
    }
}

/// Run the feed for the life of the daemon, publishing into `tx`.
pub async fn run(client: Client, cfg: FeedConfig, tx: watch::Sender<ClusterView>) {
    const PROBE_EVERY: Duration = Duration::from_secs(2);
    let expected =
        1 + usize::from(
            cfg.announcers
                .iter()
                .any(|a| !matches!(a, Announcer::MetalLb { .. })),
        ) + cfg
            .announcers
            .iter()
            .filter(|a| matches!(a, Announcer::MetalLb { .. }))
            .count();
    let mut feed = Feed {
        cfg: cfg.clone(),
        model: Model::default(),
        svc_relist: Relist::default(),
        lease_relist: Relist::default(),
        l2_relist: Relist::default(),
        synced: Default::default(),
        expected,
        failing_since: None,
        last_error: None,
    };
    let mut updates = streams(&client, &cfg);
    let probe_api = Api::<Service>::all(client.clone());
    let mut next_probe = Instant::now() + PROBE_EVERY;
    let mut was_degraded = false;
    let mut announced_sync = false;
    loop {
        let now = Instant::now();
        let wake = [
            Some(next_probe),
            feed.model.next_expiry(now),
            feed.failing_since.map(|t| t + feed.threshold()),
        ]
        .into_iter()
        .flatten()
        .filter(|t| *t > now)
        .min()
        .unwrap_or(now + PROBE_EVERY);
        let mut event_at = None;
        tokio::select! {
            item = updates.next() => {
                let Some((what, item)) = item else {
                    tracing::error!("Kubernetes watch streams ended; restarting them");
                    updates = streams(&client, &cfg);
                    continue;
                };
                let t = Instant::now();
                event_at = Some(t);
                handle(&mut feed, what, item, t);
                // Batch what is already waiting: one map update per burst.
                while let Some(Some((what, item))) = futures::FutureExt::now_or_never(updates.next()) {
                    handle(&mut feed, what, item, Instant::now());
                }
            }
            _ = tokio::time::sleep_until(wake.into()) => {
                if Instant::now() >= next_probe {
                    match probe_api.list_metadata(&ListParams::default().limit(1)).await {
                        Ok(_) => feed.ok(),
                        Err(e) => feed.failed("probe", &e, Instant::now()),
                    }
                    next_probe = Instant::now() + PROBE_EVERY;
                }
            }
        }
        let now = Instant::now();
        let view = feed.view(now, event_at);
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

fn handle(feed: &mut Feed, what: &'static str, item: Result<Update, watcher::Error>, now: Instant) {
    match item {
        Ok(u) => {
            feed.ok();
            feed.apply(u, now);
        }
        Err(e) => feed.failed(what, &e, now),
    }
}
