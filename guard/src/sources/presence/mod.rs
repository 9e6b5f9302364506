//! Presence in the Kubernetes API (the record and the table are
//! `model::presence`'s): every period this guard writes its own Lease
//! `arp-guard-<node>` in its namespace (created, then replaced with the
//! resourceVersion it last saw; a conflict re-reads it), lists every
//! presence Lease of the namespace by label, and, less often, the cluster's
//! Nodes (coverage). On SIGTERM the Lease is deleted; a guard killed
//! otherwise leaves it to expire (3 periods).
//!
//! On a thread and runtime of its own, every request bounded in time:
//! nothing here can delay or block guarding; failures are logged once per
//! kind, counted and shown in `/cluster`, and the last table read is kept.

use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

use kube::{
    api::{DeleteParams, GetParams, ListParams, PostParams},
    core::Request,
    Client,
};
use serde::Deserialize;
use serde_json::value::RawValue;

mod request;

pub use request::PresenceError;
use request::{build, decode, timed, Result};

use crate::{
    model::presence::{self, Entry, Record, Seen, Table},
    telemetry::ops::{ErrorCause, Ops},
};

/// Deleting the Lease at exit waits at most this long.
pub const LEAVE_TIMEOUT: Duration = Duration::from_secs(2);
/// Leases and Nodes per list page: a page of hostile Leases (each at most
/// the API server's 256 KiB of annotations) stays a few tens of MiB.
const PAGE: u32 = 100;
/// Nodes are listed every this many periods (they change rarely, and a big
/// cluster's list is the costliest request here).
const NODES_EVERY: u32 = 6;

#[derive(Debug, Clone)]
pub struct PresenceConfig {
    pub kubeconfig: Option<PathBuf>,
    /// None: the client's default (the service account's namespace, else
    /// the kubeconfig context's).
    pub namespace: Option<String>,
    /// This node (set at start, once its name is known).
    pub node: String,
    /// Renewal period (the Lease lasts 3 periods).
    pub period: Duration,
}

/// What the task reads from the daemon, and where it publishes.
pub struct Hooks {
    /// This guard's record now.
    pub record: Box<dyn Fn() -> Record + Send>,
    pub publish: Box<dyn Fn(Seen) + Send>,
}

/// The running task: [`Handle::leave`] deletes the Lease and ends it.
pub struct Handle {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: std::sync::mpsc::Receiver<()>,
}

impl Handle {
    /// Delete this guard's Lease (waiting at most [`LEAVE_TIMEOUT`] and a bit).
    pub fn leave(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
            let _ = self
                .done
                .recv_timeout(LEAVE_TIMEOUT + Duration::from_millis(500));
        }
    }
}

/// Start presence on a thread of its own.
pub fn start(cfg: PresenceConfig, hooks: Hooks, ops: Arc<Ops>) -> Result<Handle, PresenceError> {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("presence".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            match rt {
                Ok(rt) => rt.block_on(run(cfg, hooks, stop_rx, ops)),
                Err(e) => tracing::warn!(error = %e, "presence cannot start its runtime; guarding without it"),
            }
            let _ = done_tx.send(());
        })
        .map_err(PresenceError::Thread)?;
    Ok(Handle {
        stop: Some(stop_tx),
        done,
    })
}

/// The loop's state.
struct Task {
    client: Client,
    cfg: PresenceConfig,
    namespace: String,
    lease: String,
    /// The resourceVersion of our Lease as last written or read.
    rv: Option<String>,
    seen: Seen,
    /// Errors already logged (once per kind until it works again).
    logged: BTreeMap<&'static str, String>,
    ops: Arc<Ops>,
}

/// The requests of a period, each logged and counted on its own.
#[derive(Debug, Clone, Copy)]
enum Call {
    /// This guard's Lease.
    Write,
    /// Every presence Lease.
    List,
    /// The cluster's Nodes.
    Nodes,
}

impl Call {
    /// Its name in the logs and in `/cluster`'s errors.
    fn as_str(self) -> &'static str {
        match self {
            Call::Write => "write",
            Call::List => "list",
            Call::Nodes => "nodes",
        }
    }

    /// What a failure of it counts as.
    fn cause(self) -> ErrorCause {
        match self {
            Call::Write => ErrorCause::PresenceWrite,
            Call::List => ErrorCause::PresenceList,
            Call::Nodes => ErrorCause::PresenceNodes,
        }
    }
}

async fn run(
    cfg: PresenceConfig,
    hooks: Hooks,
    mut stop: tokio::sync::oneshot::Receiver<()>,
    ops: Arc<Ops>,
) {
    let client = match crate::sources::cluster::task::client(cfg.kubeconfig.as_deref()).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "presence: no Kubernetes client; guarding without it");
            return;
        }
    };
    let namespace =
        (cfg.namespace.clone()).unwrap_or_else(|| client.default_namespace().to_owned());
    let mut t = Task {
        lease: presence::lease_name(&cfg.node),
        seen: Seen {
            namespace: namespace.clone(),
            ..Seen::default()
        },
        namespace,
        client,
        cfg,
        rv: None,
        logged: BTreeMap::new(),
        ops,
    };
    tracing::info!(namespace = %t.namespace, lease = %t.lease, period = ?t.cfg.period, "publishing this guard's presence");
    let mut tick = tokio::time::interval(t.cfg.period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut round = 0u32;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut stop => break,
        }
        let r = t.write((hooks.record)()).await;
        t.outcome(Call::Write, r.map(|_| ()));
        let r = t.read().await;
        t.outcome(Call::List, r);
        if round.is_multiple_of(NODES_EVERY) {
            let r = t.nodes().await;
            t.seen.nodes = Some(r.as_ref().map_err(|e| format!("{e:#}")).cloned());
            t.outcome(Call::Nodes, r.map(drop));
        }
        round = round.wrapping_add(1);
        (hooks.publish)(t.seen.clone());
    }
    t.leave().await;
}

/// Bound a request in time.

#[derive(Deserialize)]
struct Meta {
    name: String,
    #[serde(default, rename = "resourceVersion")]
    resource_version: Option<String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Spec {
    renew_time: Option<String>,
    lease_duration_seconds: Option<i64>,
}

#[derive(Deserialize)]
struct LeaseObj {
    metadata: Meta,
    #[serde(default)]
    spec: Option<Spec>,
}

#[derive(Deserialize)]
struct Page {
    #[serde(default)]
    metadata: PageMeta,
    #[serde(default)]
    items: Vec<Box<RawValue>>,
}

#[derive(Deserialize, Default)]
struct PageMeta {
    #[serde(default, rename = "continue")]
    cont: Option<String>,
}

impl Task {
    fn path(&self) -> String {
        format!(
            "/apis/coordination.k8s.io/v1/namespaces/{}/leases",
            self.namespace
        )
    }

    fn body(&self, r: &Record, rv: Option<&str>) -> Vec<u8> {
        let mut meta = serde_json::json!({
            "name": self.lease,
            "namespace": self.namespace,
            "labels": {presence::LABEL: presence::LABEL_VALUE},
            "annotations": {presence::ANNOTATION: r.encode()},
        });
        if let Some(rv) = rv {
            meta["resourceVersion"] = rv.into();
        }
        let duration = (self.cfg.period.as_secs().max(1) * 3).min(i32::MAX as u64);
        let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S.%6fZ");
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.cfg.node,
                "leaseDurationSeconds": duration,
                "renewTime": now.to_string(),
            },
        }))
        .unwrap_or_default()
    }

    async fn send(&self, req: http::Request<Vec<u8>>) -> Result<Option<String>> {
        let text = timed(self.client.request_text(req)).await?;
        let o: LeaseObj = decode(&text, "the API's answer")?;
        Ok(o.metadata.resource_version)
    }

    /// Create or replace our Lease; a stale resourceVersion (409) or a
    /// Lease deleted behind our back (404) is read again and retried once.
    async fn write(&mut self, r: Record) -> Result<()> {
        for _ in 0..2 {
            let pp = PostParams::default();
            let res = match self.rv.clone() {
                Some(rv) => {
                    let req = Request::new(self.path()).replace(
                        &self.lease,
                        &pp,
                        self.body(&r, Some(&rv)),
                    );
                    self.send(build(req)?).await
                }
                None => {
                    let req = Request::new(self.path()).create(&pp, self.body(&r, None));
                    self.send(build(req)?).await
                }
            };
            match res {
                Ok(rv) => {
                    self.rv = rv;
                    self.seen.published = true;
                    return Ok(());
                }
                Err(e) if matches!(e.code(), Some(409) | Some(404)) => {
                    self.ops.error(ErrorCause::PresenceConflict);
                    self.rv = self.current_rv().await?;
                }
                Err(e) => return Err(e),
            }
        }
        Err(PresenceError::KeptChanging(self.lease.clone()))
    }

    /// Our Lease's resourceVersion as the API has it (None: there is none).
    async fn current_rv(&self) -> Result<Option<String>> {
        let req = build(Request::new(self.path()).get(&self.lease, &GetParams::default()))?;
        match timed(self.client.request_text(req)).await {
            Ok(text) => Ok(decode::<LeaseObj>(&text, "the API's answer")?
                .metadata
                .resource_version),
            Err(e) if e.code() == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every presence Lease of the namespace (paged, bounded): the table
    /// replaced only once every page was read.
    async fn read(&mut self) -> Result<()> {
        let mut table = Table::default();
        let mut cont: Option<String> = None;
        loop {
            let mut lp = ListParams::default()
                .labels(&format!("{}={}", presence::LABEL, presence::LABEL_VALUE))
                .limit(PAGE);
            // Every guard lists every record each period: the first page
            // from the API server's cache (resourceVersion=0), never a
            // quorum read of etcd; a continuation carries no version.
            lp = match cont.take() {
                None => lp.match_any(),
                Some(c) => {
                    lp.continue_token = Some(c);
                    lp
                }
            };
            let req = build(Request::new(self.path()).list(&lp))?;
            let text = timed(self.client.request_text(req)).await?;
            let page: Page = decode(&text, "a list of Leases")?;
            for item in &page.items {
                match entry(item.get()) {
                    Ok(e) => {
                        table.insert(e);
                    }
                    Err(why) => {
                        table.skipped += 1;
                        self.ops.error(ErrorCause::PresenceSkipped);
                        tracing::debug!(why = %why, "presence: a Lease skipped");
                    }
                }
            }
            cont = page.metadata.cont.filter(|c| !c.is_empty());
            if cont.is_none() || table.nodes.len() >= presence::MAX_RECORDS {
                break;
            }
        }
        self.seen.table = Arc::new(table);
        self.seen.read_unix = Some(jiff::Timestamp::now().as_second());
        Ok(())
    }

    /// The names of the cluster's Nodes (metadata only, paged, bounded).
    async fn nodes(&self) -> Result<Vec<String>> {
        #[derive(Deserialize)]
        struct Named {
            metadata: NameOnly,
        }
        #[derive(Deserialize)]
        struct NameOnly {
            name: String,
        }
        #[derive(Deserialize)]
        struct NodePage {
            #[serde(default)]
            metadata: PageMeta,
            #[serde(default)]
            items: Vec<Named>,
        }
        let mut out = Vec::new();
        let mut cont: Option<String> = None;
        loop {
            let mut lp = ListParams::default().limit(PAGE * 5);
            lp.continue_token = cont.take();
            let mut req = build(Request::new("/api/v1/nodes").list(&lp))?;
            req.headers_mut().insert(
                http::header::ACCEPT,
                http::HeaderValue::from_static(
                    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
                ),
            );
            let text = timed(self.client.request_text(req)).await?;
            let page: NodePage = decode(&text, "a list of Nodes")?;
            out.extend(page.items.into_iter().map(|n| n.metadata.name));
            cont = page.metadata.cont.filter(|c| !c.is_empty());
            if cont.is_none() || out.len() >= presence::MAX_RECORDS * 2 {
                return Ok(out);
            }
        }
    }

    /// Log a failure once per kind (and its end), count it, keep it for `/cluster`.
    fn outcome(&mut self, req: Call, r: Result<()>) {
        let what = req.as_str();
        match r {
            Ok(()) => {
                if self.logged.remove(what).is_some() {
                    tracing::info!(what, "presence: the Kubernetes API answers again");
                }
                self.seen.errors.remove(what);
            }
            Err(e) => {
                let msg = format!("{e:#}");
                self.ops.error(req.cause());
                if self.logged.insert(what, msg.clone()).is_none() {
                    tracing::warn!(what, error = %msg, "presence: request failed (guarding goes on; retried every period)");
                }
                self.seen.errors.insert(what.to_owned(), msg);
            }
        }
    }

    /// Delete our Lease (clean exit), bounded.
    async fn leave(&self) {
        let req =
            match build(Request::new(self.path()).delete(&self.lease, &DeleteParams::default())) {
                Ok(r) => r,
                Err(_) => return,
            };
        match tokio::time::timeout(LEAVE_TIMEOUT, self.client.request_text(req)).await {
            Ok(Ok(_)) => tracing::info!(lease = %self.lease, "presence Lease deleted"),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot delete the presence Lease; it expires by itself")
            }
            Err(_) => tracing::warn!("deleting the presence Lease timed out; it expires by itself"),
        }
    }
}

/// One Lease of a list as a table entry.
fn entry(raw: &str) -> Result<Entry, String> {
    let o: LeaseObj = serde_json::from_str(raw).map_err(|e| e.to_string())?;
    let record = Record::decode(
        o.metadata
            .annotations
            .get(presence::ANNOTATION)
            .map(String::as_str),
    )
    .map_err(|e| format!("{}: {e}", o.metadata.name))?;
    if presence::lease_name(&record.node) != o.metadata.name {
        return Err(format!(
            "{}: a record for node {:?} in another node's Lease",
            o.metadata.name, record.node
        ));
    }
    let spec = o.spec.unwrap_or_default();
    let renew_unix = spec
        .renew_time
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .map_or(0, |t| t.as_second());
    Ok(Entry {
        record,
        renew_unix,
        duration_s: spec.lease_duration_seconds.unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::presence::Iface;

    fn lease(name: &str, annotation: serde_json::Value) -> String {
        serde_json::json!({
            "metadata": {"name": name, "annotations": {presence::ANNOTATION: annotation}},
            "spec": {"renewTime": "2026-01-01T00:00:10.000000Z", "leaseDurationSeconds": 30},
        })
        .to_string()
    }

    #[test]
    fn a_lease_is_read_into_an_entry_and_a_forged_one_is_not() {
        let r = Record {
            node: "node-a".into(),
            mode: "enforce".into(),
            version: "1".into(),
            health: "enforcing".into(),
            interfaces: vec![Iface {
                name: "eth0".into(),
                mac: "02:00:00:00:00:0a".into(),
            }],
            other: vec![],
            kernel_answers: false,
        };
        let e = entry(&lease("arp-guard-node-a", r.encode().into())).unwrap();
        assert_eq!(e.record, r);
        assert_eq!((e.duration_s, e.renew_unix), (30, 1_767_225_610));
        let forged = entry(&lease("arp-guard-node-b", r.encode().into()));
        assert!(forged.unwrap_err().contains("another node's Lease"));
        assert!(entry(&lease("arp-guard-x", serde_json::json!(7))).is_err());
        assert!(entry("{\"metadata\":{\"name\":\"arp-guard-x\"}}").is_err());
    }
}
