//! This guard's own presence Lease: written when its record changes (not
//! renewed: liveness is the guard Pod's Ready condition), replaced at the
//! resourceVersion last seen (a 409 or 404 reads it again and retries
//! once), deleted at a clean exit.

use kube::{
    api::{DeleteParams, GetParams, PostParams},
    core::Request,
    Client,
};
use serde::Deserialize;

use super::request::{build, decode, timed, PresenceError, Result};
use crate::model::presence::{self, Record};

/// Where this guard's record goes.
pub struct Own {
    pub client: Client,
    pub namespace: String,
    pub node: String,
    /// `arp-guard-<node>`.
    pub lease: String,
    /// The record as the API holds it now (None: none, or one that does not
    /// read), from the last write or from the records' watch.
    pub stored: Option<Record>,
    /// The Lease's resourceVersion (None: there is no Lease).
    pub rv: Option<String>,
}

#[derive(Deserialize)]
struct Answer {
    metadata: AnswerMeta,
}

#[derive(Deserialize)]
struct AnswerMeta {
    #[serde(default, rename = "resourceVersion")]
    resource_version: Option<String>,
}

impl Own {
    fn path(&self) -> String {
        format!(
            "/apis/coordination.k8s.io/v1/namespaces/{}/leases",
            self.namespace
        )
    }

    /// The Lease's body. `renewTime` is when the record was written; there
    /// is no `leaseDurationSeconds`: the record lasts while its guard's Pod
    /// is Ready (a guard of the version before this one, which reads expiry
    /// from the duration, counts such a record as expired during a rolling
    /// update).
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
        let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S.%6fZ");
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.node,
                "renewTime": now.to_string(),
            },
        }))
        .unwrap_or_default()
    }

    async fn send(&self, req: http::Request<Vec<u8>>) -> Result<Option<String>> {
        let text = timed(self.client.request_text(req)).await?;
        let a: Answer = decode(&text, "the API's answer")?;
        Ok(a.metadata.resource_version)
    }

    /// Whether `r` differs from what the API holds.
    pub fn differs(&self, r: &Record) -> bool {
        self.stored.as_ref() != Some(r)
    }

    /// Create or replace the Lease with `r`; a stale resourceVersion (409) or
    /// a Lease deleted behind our back (404) is read again and retried once.
    /// `conflict` is called for each such retry.
    pub async fn write(&mut self, r: &Record, conflict: impl Fn()) -> Result<()> {
        let mut rv = self.rv.clone();
        for _ in 0..2 {
            let pp = PostParams::default();
            let req = match &rv {
                Some(rv) => {
                    Request::new(self.path()).replace(&self.lease, &pp, self.body(r, Some(rv)))
                }
                None => Request::new(self.path()).create(&pp, self.body(r, None)),
            };
            match self.send(build(req)?).await {
                Ok(new_rv) => {
                    (self.stored, self.rv) = (Some(r.clone()), new_rv);
                    return Ok(());
                }
                Err(e) if matches!(e.code(), Some(409) | Some(404)) => {
                    conflict();
                    rv = self.current_rv().await?;
                }
                Err(e) => return Err(e),
            }
        }
        Err(PresenceError::KeptChanging(self.lease.clone()))
    }

    /// The Lease's resourceVersion as the API has it (None: there is none).
    async fn current_rv(&self) -> Result<Option<String>> {
        let req = build(Request::new(self.path()).get(&self.lease, &GetParams::default()))?;
        match timed(self.client.request_text(req)).await {
            Ok(text) => Ok(decode::<Answer>(&text, "the API's answer")?
                .metadata
                .resource_version),
            Err(e) if e.code() == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Delete the Lease (clean exit), bounded.
    pub async fn leave(&self) {
        let req =
            match build(Request::new(self.path()).delete(&self.lease, &DeleteParams::default())) {
                Ok(r) => r,
                Err(_) => return,
            };
        match tokio::time::timeout(super::LEAVE_TIMEOUT, self.client.request_text(req)).await {
            Ok(Ok(_)) => tracing::info!(lease = %self.lease, "presence Lease deleted"),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot delete the presence Lease; its Pod's readiness says the guard is gone")
            }
            Err(_) => tracing::warn!(
                "deleting the presence Lease timed out; its Pod's readiness says the guard is gone"
            ),
        }
    }
}
