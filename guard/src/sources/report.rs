//! This node's ArpGuardNode, kept equal to its findings: written only when
//! they change, at most once per `interval` plus a random part of it (a
//! mass failover does not make every guard write in the same second), and
//! never at rest. What the API already holds is read once at start (a
//! restart that changes nothing writes nothing). Created with the Node as
//! its owner (it goes with the Node); replaced with one JSON Patch of its
//! `status` afterwards.
//!
//! On a task of its own, every request bounded in time: a slow or refusing
//! API never delays guarding. A refused write (no CRD: 404; RBAC or the
//! admission policy: 403) is said once and tried again after a back-off
//! doubling to [`BACKOFF_MAX`]; the findings keep being computed.

use std::time::{Duration, Instant};

use guard_wire::node::{
    ArpGuardNode, Metadata, NodeReport, OwnerReference, API_VERSION, KIND, PLURAL,
};
use kube::Client;
use tokio::sync::watch;

use crate::{
    ops::{ErrorCause, Ops},
    sources::own_node::OwnNode,
};

/// A failed write is tried again after at most this long.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// Each request gives up after this long.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The collection's path.
pub fn path() -> String {
    format!("/apis/{API_VERSION}/{PLURAL}")
}

/// Where and how often.
#[derive(Debug, Clone)]
pub struct ReportConfig {
    pub node: String,
    /// At most one write per this long (plus up to a fifth of it, random).
    pub interval: Duration,
}

/// Keep node `cfg.node`'s object equal to what `findings` publishes.
pub fn spawn(
    cfg: ReportConfig,
    client: Client,
    own: watch::Receiver<Option<OwnNode>>,
    findings: watch::Receiver<NodeReport>,
    ops: std::sync::Arc<Ops>,
) {
    tokio::spawn(async move {
        let mut w = Writer {
            url: format!("{}/{}", path(), cfg.node),
            cfg,
            client,
            own,
            ops,
            held: Held::Unknown,
            failures: 0,
            said: None,
        };
        w.run(findings).await;
    });
}

/// What the API holds, as far as this writer knows.
#[derive(Debug, Clone, PartialEq)]
enum Held {
    /// Not read yet (or a write failed in a way that leaves it unknown).
    Unknown,
    Absent,
    /// Its content (without `updated`).
    Content(Box<NodeReport>),
}

struct Writer {
    cfg: ReportConfig,
    url: String,
    client: Client,
    own: watch::Receiver<Option<OwnNode>>,
    ops: std::sync::Arc<Ops>,
    held: Held,
    failures: u32,
    /// The failure said last (said again only when it changes).
    said: Option<String>,
}

/// A refused or failed request: the API's status code if it answered one.
struct Failed {
    code: Option<u16>,
    text: String,
}

impl Writer {
    async fn run(&mut self, mut findings: watch::Receiver<NodeReport>) {
        let mut next_write = Instant::now();
        loop {
            if findings.changed().await.is_err() {
                return;
            }
            // Coalesce: wait out the interval, then write what is current.
            tokio::time::sleep_until(next_write.into()).await;
            loop {
                let want = findings.borrow_and_update().content();
                match self.sync(&want).await {
                    Ok(wrote) => {
                        self.failures = 0;
                        self.said = None;
                        if wrote {
                            next_write = Instant::now() + self.spaced();
                        }
                        break;
                    }
                    Err(f) => {
                        self.failed(f);
                        tokio::time::sleep(self.backoff()).await;
                    }
                }
            }
        }
    }

    /// `interval` plus a random fifth of it at most.
    fn spaced(&self) -> Duration {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        self.cfg.interval + self.cfg.interval * (nanos % 1000) / 5000
    }

    fn backoff(&self) -> Duration {
        let base = self.cfg.interval.max(Duration::from_secs(1));
        (base * 2u32.saturating_pow(self.failures.min(8))).min(BACKOFF_MAX)
    }

    fn failed(&mut self, f: Failed) {
        self.failures += 1;
        self.ops.error(ErrorCause::NodeReport);
        if self.said.as_deref() != Some(&f.text) {
            let hint = match f.code {
                Some(404) => " (is the ArpGuardNode CRD installed? deploy/base/crd.yaml)",
                Some(403) => {
                    " (RBAC, or the admission policy: each guard writes only its own node's)"
                }
                _ => "",
            };
            tracing::warn!(error = %f.text, retry_in = ?self.backoff(), "cannot write this node's ArpGuardNode{hint}; guarding is not affected");
            self.said = Some(f.text);
        }
    }

    /// Bring the object to `want`; whether a write was made.
    async fn sync(&mut self, want: &NodeReport) -> Result<bool, Failed> {
        if self.held == Held::Unknown {
            self.held = self.read().await?;
        }
        if self.held == Held::Content(Box::new(want.clone())) {
            return Ok(false);
        }
        let mut status = want.clone();
        let now = jiff::Timestamp::now().as_second();
        status.updated = jiff::Timestamp::from_second(now)
            .ok()
            .map(|t| t.to_string());
        let r = match self.held {
            Held::Absent => self.create(status).await,
            _ => self.replace(status).await,
        };
        match r {
            Ok(()) => {
                self.held = Held::Content(Box::new(want.clone()));
                Ok(true)
            }
            Err(f) => {
                // Deleted behind our back (404 on the patch), or anything
                // else: read again before the next try.
                self.held = Held::Unknown;
                Err(f)
            }
        }
    }

    /// What the API holds now (from its cache).
    async fn read(&self) -> Result<Held, Failed> {
        let req = http::Request::get(format!("{}?resourceVersion=0", self.url))
            .body(Vec::new())
            .map_err(|e| Failed {
                code: None,
                text: e.to_string(),
            })?;
        match self.request(req).await {
            Ok(text) => {
                let o: ArpGuardNode = serde_json::from_str(&text).map_err(|e| Failed {
                    code: None,
                    text: format!("not an ArpGuardNode: {e}"),
                })?;
                Ok(Held::Content(Box::new(o.status.content())))
            }
            Err(f) if f.code == Some(404) => Ok(Held::Absent),
            Err(f) => Err(f),
        }
    }

    /// Create it, owned by the Node (whose UID must be known first).
    async fn create(&mut self, status: NodeReport) -> Result<(), Failed> {
        let uid = self.own.borrow().as_ref().map(|n| n.uid.clone());
        let uid = match uid {
            Some(uid) => uid,
            None => {
                // Not before the Node is read: without its owner it would
                // outlive the Node.
                let _ = self.own.wait_for(Option::is_some).await;
                let n = self.own.borrow();
                n.as_ref().map(|n| n.uid.clone()).unwrap_or_default()
            }
        };
        let o = ArpGuardNode {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            metadata: Metadata {
                name: self.cfg.node.clone(),
                resource_version: None,
                owner_references: vec![OwnerReference::node(&self.cfg.node, &uid)],
            },
            status,
        };
        let body = serde_json::to_vec(&o).map_err(|e| Failed {
            code: None,
            text: e.to_string(),
        })?;
        let req = http::Request::post(path())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body)
            .map_err(|e| Failed {
                code: None,
                text: e.to_string(),
            })?;
        match self.request(req).await {
            Ok(_) => Ok(()),
            // Created meanwhile (a previous daemon's write we did not see):
            // replace it.
            Err(f) if f.code == Some(409) => self.replace(o.status).await,
            Err(f) => Err(f),
        }
    }

    /// Replace its `status` whole (JSON Patch `add` sets or replaces it).
    async fn replace(&self, status: NodeReport) -> Result<(), Failed> {
        let patch = serde_json::json!([{"op": "add", "path": "/status", "value": status}]);
        let body = serde_json::to_vec(&patch).map_err(|e| Failed {
            code: None,
            text: e.to_string(),
        })?;
        let req = http::Request::patch(&self.url)
            .header(http::header::CONTENT_TYPE, "application/json-patch+json")
            .body(body)
            .map_err(|e| Failed {
                code: None,
                text: e.to_string(),
            })?;
        self.request(req).await.map(drop)
    }

    async fn request(&self, req: http::Request<Vec<u8>>) -> Result<String, Failed> {
        match tokio::time::timeout(TIMEOUT, self.client.request_text(req)).await {
            Err(_) => Err(Failed {
                code: None,
                text: format!("no answer within {TIMEOUT:?}"),
            }),
            Ok(Ok(text)) => Ok(text),
            Ok(Err(e)) => Err(Failed {
                code: match &e {
                    kube::Error::Api(s) => Some(s.code),
                    _ => None,
                },
                text: e.to_string(),
            }),
        }
    }
}
