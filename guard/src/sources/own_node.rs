//! This guard's own Node, read once from the API server's cache: its UID
//! (the ArpGuardNode is owned by it, so it goes with the Node) and its
//! InternalIP and ExternalIP addresses (`--interface auto`). Retried with
//! back-off while the API fails, every [`REFUSED_RETRY`] while it refuses
//! (403) or has no such Node (404): never more than one request at a time,
//! nothing once read. A node's UID and addresses do not change while it
//! lives; a restart reads them again.

use std::{net::IpAddr, time::Duration};

use kube::Client;
use serde::Deserialize;
use tokio::sync::watch;

use crate::sources::cluster::listwatch::backoff;

/// A refused or missing Node is asked again after this long.
pub const REFUSED_RETRY: Duration = Duration::from_secs(600);
/// The first retry of a failed read; doubling to 30 s.
const RETRY: Duration = Duration::from_secs(1);
/// Each read gives up after this long.
const TIMEOUT: Duration = Duration::from_secs(10);

/// What the guard needs of its Node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnNode {
    pub uid: String,
    /// InternalIP and ExternalIP, sorted.
    pub addresses: Vec<IpAddr>,
}

/// Read `node` until it answers; published once on the returned channel
/// (None until then).
pub fn spawn(client: Client, node: String) -> watch::Receiver<Option<OwnNode>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let n = read_until_answered(&client, &node).await;
        tracing::info!(node = %node, addresses = ?n.addresses, "read this guard's Node");
        tx.send_replace(Some(n));
        // Held open: a closed channel would read as "no Node, ever".
        tx.closed().await;
    });
    rx
}

async fn read_until_answered(client: &Client, node: &str) -> OwnNode {
    let mut attempt = 0;
    loop {
        match read(client, node).await {
            Ok(n) => return n,
            Err((code, e)) => {
                if attempt == 0 {
                    tracing::info!(node = %node, error = %e, "cannot read this guard's Node yet; retrying");
                }
                let wait = match code {
                    Some(403 | 404) => REFUSED_RETRY,
                    _ => backoff(RETRY, attempt),
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
    metadata: Meta,
    #[serde(default)]
    status: Option<NodeStatus>,
}

#[derive(Deserialize, Default)]
struct Meta {
    #[serde(default)]
    uid: String,
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

/// The Node; Err: the API's status code if it gave one, and why.
async fn read(client: &Client, node: &str) -> Result<OwnNode, (Option<u16>, String)> {
    // resourceVersion=0: from the API server's cache, not a quorum read.
    let req = http::Request::get(format!("/api/v1/nodes/{node}?resourceVersion=0"))
        .body(Vec::new())
        .map_err(|e| (None, e.to_string()))?;
    let text = tokio::time::timeout(TIMEOUT, client.request_text(req))
        .await
        .map_err(|_| (None, format!("no answer within {TIMEOUT:?}")))?
        .map_err(|e| match &e {
            kube::Error::Api(s) => (Some(s.code), e.to_string()),
            _ => (None, e.to_string()),
        })?;
    let n: Node = serde_json::from_str(&text).map_err(|e| (None, format!("not a Node: {e}")))?;
    Ok(of(n))
}

fn of(n: Node) -> OwnNode {
    let mut addresses: Vec<IpAddr> = (n.status.into_iter())
        .flat_map(|s| s.addresses)
        .filter(|a| a.kind == "InternalIP" || a.kind == "ExternalIP")
        .filter_map(|a| a.address.parse().ok())
        .collect();
    addresses.sort_unstable();
    addresses.dedup();
    OwnNode {
        uid: n.metadata.uid,
        addresses,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_s_uid_and_its_internal_and_external_addresses() {
        let n: Node = serde_json::from_str(
            r#"{"metadata":{"name":"node-a","uid":"u-1"},"status":{"addresses":[{"type":"Hostname","address":"node-a"},
                {"type":"InternalIP","address":"198.51.100.2"},{"type":"InternalIP","address":"fd00::2"},
                {"type":"ExternalIP","address":"203.0.113.2"},{"type":"InternalIP","address":"junk"}]}}"#,
        )
        .unwrap();
        let n = of(n);
        assert_eq!(n.uid, "u-1");
        let ips: Vec<String> = n.addresses.iter().map(|i| i.to_string()).collect();
        assert_eq!(ips, ["198.51.100.2", "203.0.113.2", "fd00::2"]);
    }
}
