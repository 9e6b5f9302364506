//! What presence reads of the API's objects: a presence Lease as a table
//! entry (or why it is skipped), a guard Pod as its node and readiness.
//! Slim types, decoded one object at a time as the feed's are
//! (`sources::cluster::decode`): a Pod's spec and status are read for two
//! fields and the rest is skipped unread.

use serde::Deserialize;

use crate::{
    model::presence::{self, Entry, GuardPod, Record},
    sources::cluster::decode::{Lease, Meta, Object},
};

/// A guard Pod: the node it runs on and its Ready condition.
#[derive(Debug, Clone, Deserialize)]
pub struct Pod {
    pub metadata: Meta,
    #[serde(default)]
    spec: Option<PodSpec>,
    #[serde(default)]
    status: Option<PodStatus>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodSpec {
    #[serde(default)]
    node_name: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct PodStatus {
    #[serde(default)]
    conditions: Option<Vec<Condition>>,
}

#[derive(Debug, Clone, Deserialize)]
struct Condition {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    status: String,
}

impl Object for Pod {
    fn meta(&self) -> &Meta {
        &self.metadata
    }
}

impl Pod {
    /// Its node and readiness; None while it is not scheduled.
    pub fn guard(&self) -> Option<GuardPod> {
        let node = self.spec.as_ref()?.node_name.clone()?;
        let ready = (self.status.as_ref().and_then(|s| s.conditions.as_ref()))
            .is_some_and(|c| c.iter().any(|c| c.kind == "Ready" && c.status == "True"));
        Some(GuardPod { node, ready })
    }
}

/// One presence Lease as a table entry, or why it cannot be one.
pub fn entry(l: &Lease) -> Result<Entry, String> {
    let name = l.metadata.name.as_deref().unwrap_or_default();
    let record = Record::decode(l.metadata.annotations.get(presence::ANNOTATION))
        .map_err(|e| format!("{name}: {e}"))?;
    if presence::lease_name(&record.node) != name {
        return Err(format!(
            "{name}: a record for node {:?} in another node's Lease",
            record.node
        ));
    }
    let written_unix = (l.spec.as_ref().and_then(|s| s.renew_time.as_deref()))
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .map_or(0, |t| t.as_second());
    Ok(Entry {
        record,
        written_unix,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{model::presence::Iface, sources::cluster::decode::decode};

    /// (An annotation that is not a string does not decode as a Lease at
    /// all: the presence task skips it as a bad object.)
    fn lease(name: &str, annotation: serde_json::Value) -> Lease {
        let text = serde_json::json!({
            "metadata": {"name": name, "annotations": {presence::ANNOTATION: annotation}},
            "spec": {"renewTime": "2026-01-01T00:00:10.000000Z"},
        })
        .to_string();
        serde_json::from_str(&text).unwrap()
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
        assert_eq!(
            (e.record.clone(), e.written_unix),
            (r.clone(), 1_767_225_610)
        );
        let forged = entry(&lease("arp-guard-node-b", r.encode().into()));
        assert!(forged.unwrap_err().contains("another node's Lease"));
        let bare: Lease =
            serde_json::from_str("{\"metadata\":{\"name\":\"arp-guard-x\"}}").unwrap();
        assert!(entry(&bare)
            .unwrap_err()
            .contains("no arp-guard.io/presence"));
        let junk = lease("arp-guard-x", serde_json::json!("{not json"));
        assert!(entry(&junk).unwrap_err().contains("malformed"));
    }

    #[test]
    fn a_pod_is_its_node_and_its_ready_condition() {
        let pod = |conditions: serde_json::Value| {
            let text = serde_json::json!({
                "metadata": {"name": "arp-guard-x1", "managedFields": [{"manager": "kubelet"}]},
                "spec": {"nodeName": "node-a", "containers": [{"name": "guard"}]},
                "status": {"phase": "Running", "conditions": conditions},
            })
            .to_string();
            match decode::<Pod>(&text) {
                crate::sources::cluster::decode::Obj::Good(p) => p.guard(),
                crate::sources::cluster::decode::Obj::Bad(b) => panic!("{b:?}"),
            }
        };
        let ready = serde_json::json!([{"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "True"}]);
        assert_eq!(
            pod(ready),
            Some(GuardPod {
                node: "node-a".into(),
                ready: true
            })
        );
        let not = serde_json::json!([{"type": "Ready", "status": "False"}]);
        assert_eq!(pod(not).map(|p| p.ready), Some(false));
        assert_eq!(pod(serde_json::Value::Null).map(|p| p.ready), Some(false));
        let pending: Pod = serde_json::from_str("{\"metadata\":{\"name\":\"p\"}}").unwrap();
        assert_eq!(pending.guard(), None, "not scheduled yet");
    }
}
