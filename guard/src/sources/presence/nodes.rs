//! The names of the cluster's Nodes, for coverage (which nodes run no live
//! guard). Read as metadata only, the first page from the API server's
//! watch cache (`resourceVersion=0`, never a quorum read of etcd), and only
//! when it is worth it: asked for (`/cluster`), or by the one guard that
//! keeps the coverage metric, every [`NODES_EVERY`]. Every guard listing
//! every Node is N^2; one guard's list is O(N) for the fleet.

use std::{net::IpAddr, time::Duration};

use kube::Client;
use serde::Deserialize;

use super::request::{decode, timed, Result};
use crate::model::{presence::MAX_RECORDS, probing::asks};
use crate::sources::cluster::listwatch::{list_request, Collection};

/// The coverage keeper reads the Nodes this often...
pub const NODES_EVERY: Duration = Duration::from_secs(600);
/// ...not before this long after its start...
pub const KEEPER_GRACE: Duration = Duration::from_secs(60);
/// ...and a read asked for is answered from a list at most this old.
pub const ASKED_FRESH: Duration = Duration::from_secs(30);
/// Nodes per page.
const PAGE: u32 = 500;
/// The key the coverage keeper is chosen by, as if it were an IP: the
/// rendezvous of the active census (`model::probing::asks`), one asker.
const KEEPER_KEY: IpAddr = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);

/// Whether `me` keeps the coverage metric among `live` guards: one guard of
/// the cluster (two for a moment where views differ), the same for all.
pub fn keeper(me: &str, live: &[String]) -> bool {
    asks(me, KEEPER_KEY, live, None, 1)
}

/// The names of the cluster's Nodes (metadata only, paged, bounded).
pub async fn list(client: &Client) -> Result<Vec<String>> {
    #[derive(Deserialize)]
    struct Named {
        metadata: NameOnly,
    }
    #[derive(Deserialize)]
    struct NameOnly {
        name: String,
    }
    #[derive(Deserialize, Default)]
    struct PageMeta {
        #[serde(default, rename = "continue")]
        cont: Option<String>,
    }
    #[derive(Deserialize)]
    struct NodePage {
        #[serde(default)]
        metadata: PageMeta,
        #[serde(default)]
        items: Vec<Named>,
    }
    let nodes = Collection {
        path: "/api/v1/nodes".into(),
        cached: true,
        page: PAGE,
        ..Default::default()
    };
    let mut out = Vec::new();
    let mut cont: Option<String> = None;
    loop {
        let mut req = list_request(&nodes, None, cont.as_deref());
        req.headers_mut().insert(
            http::header::ACCEPT,
            http::HeaderValue::from_static(
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
            ),
        );
        let text = timed(client.request_text(req)).await?;
        let page: NodePage = decode(&text, "a list of Nodes")?;
        out.extend(page.items.into_iter().map(|n| n.metadata.name));
        match page.metadata.cont.filter(|c| !c.is_empty()) {
            Some(c) if out.len() < MAX_RECORDS * 2 => cont = Some(c),
            _ => return Ok(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_keeper_among_the_live_guards_whoever_asks() {
        let live: Vec<String> = (0..50).map(|i| format!("node-{i}")).collect();
        let keepers: Vec<&String> = live.iter().filter(|n| keeper(n, &live)).collect();
        assert_eq!(keepers.len(), 1, "{keepers:?}");
        // Gone: another takes over; a guard not live keeps nothing.
        let rest: Vec<String> = live.iter().filter(|n| *n != keepers[0]).cloned().collect();
        assert_eq!(rest.iter().filter(|n| keeper(n, &rest)).count(), 1);
        assert!(!keeper(keepers[0], &rest));
    }
}
