//! The lists the plugin reads without kube's typed API: every node's
//! ArpGuardNode (a CRD of arp-guard's own: its type is guard-wire's), and
//! Pods and Nodes as server-side Tables. Each from the API server's cache,
//! within the request timeout, a 403 as the error naming what to grant.

use std::collections::{BTreeMap, BTreeSet};

use guard_wire::node::{self, ArpGuardNode};

use crate::{
    cluster::{denied_or, GuardPod, Reader},
    table::{urlencoded, Table, TABLE},
};

/// ArpGuardNodes per page.
const PAGE: u32 = 500;

impl Reader<'_> {
    /// Every node's name, or why they could not be read (not allowed, no
    /// answer): the nodes without a guard are then not named, and the
    /// output says why. As a server-side Table without the objects: a
    /// Node's metadata alone is 1-4 kB, a row a few dozen bytes.
    pub async fn nodes(&self) -> Result<BTreeSet<String>, String> {
        let t = self
            .table("/api/v1/nodes", "")
            .await
            .map_err(|e| format!("{e:#}"))?;
        Ok(t.rows.iter().filter_map(|r| t.cell(r, "Name")).collect())
    }

    /// The guard Pods' readiness, by node, as a server-side Table (Name,
    /// Ready, Status, Node): what the views from the API need of them,
    /// without the Pods (5-8 kB each).
    pub async fn pods_ready(&self) -> anyhow::Result<BTreeMap<String, GuardPod>> {
        let path = format!("/api/v1/namespaces/{}/pods", self.namespace);
        let query = format!("labelSelector={}", urlencoded(self.selector));
        let t = self.table(&path, &query).await?;
        let mut out = BTreeMap::new();
        for r in &t.rows {
            let (Some(name), Some(node)) = (t.cell(r, "Name"), t.cell(r, "Node")) else {
                continue;
            };
            let ready = t.cell(r, "Ready").is_some_and(|x| {
                let (a, b) = x.split_once('/').unwrap_or(("0", "1"));
                a == b && a != "0"
            });
            let phase = t.cell(r, "Status").unwrap_or_default();
            let g = GuardPod {
                name,
                node: node.clone(),
                ready,
                running: phase == "Running",
                why: (!ready).then(|| {
                    if phase == "Running" {
                        "not Ready".into()
                    } else {
                        phase
                    }
                }),
                image: None,
                container: self.container.to_owned(),
            };
            let keep = out
                .get(&node)
                .is_none_or(|o: &GuardPod| !o.ready && g.ready);
            if keep {
                out.insert(node, g);
            }
        }
        Ok(out)
    }

    /// Every ArpGuardNode (each node's findings), from the API server's
    /// cache, in pages of [`PAGE`].
    pub async fn reports(&self) -> anyhow::Result<Vec<ArpGuardNode>> {
        #[derive(serde::Deserialize)]
        struct List {
            #[serde(default)]
            metadata: ListMeta,
            #[serde(default)]
            items: Vec<ArpGuardNode>,
        }
        #[derive(serde::Deserialize, Default)]
        struct ListMeta {
            #[serde(default, rename = "continue")]
            cont: Option<String>,
        }
        let path = format!("/apis/{}/{}", node::API_VERSION, node::PLURAL);
        let mut out = Vec::new();
        let mut cont: Option<String> = None;
        loop {
            let mut query = format!("limit={PAGE}");
            match &cont {
                Some(c) => query.push_str(&format!("&continue={}", urlencoded(c))),
                None => query.push_str("&resourceVersion=0"),
            }
            let text = self
                .get(
                    &format!("{path}?{query}"),
                    None,
                    ("arpguardnodes.arp-guard.io", "cluster"),
                )
                .await?;
            let page: List = serde_json::from_str(&text)
                .map_err(|e| anyhow::anyhow!("list arpguardnodes.arp-guard.io: not a list: {e}"))?;
            out.extend(page.items);
            cont = page.metadata.cont.filter(|c| !c.is_empty());
            if cont.is_none() {
                return Ok(out);
            }
        }
    }

    /// A list as a server-side Table without its objects, from the cache.
    async fn table(&self, path: &str, query: &str) -> anyhow::Result<Table> {
        let sep = if query.is_empty() { "" } else { "&" };
        let url = format!("{path}?{query}{sep}resourceVersion=0&includeObject=None");
        let what = if path.ends_with("/nodes") {
            "nodes"
        } else {
            "pods"
        };
        let scope = if what == "nodes" {
            "cluster".to_owned()
        } else {
            format!("namespace {}", self.namespace)
        };
        let text = self.get(&url, Some(TABLE), (what, &scope)).await?;
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("list {what}: not a Table: {e}"))
    }

    /// GET `url` (with `accept`), bounded by the request timeout; a 403 as
    /// the error naming the verb and `resource`.
    async fn get(
        &self,
        url: &str,
        accept: Option<&str>,
        (resource, scope): (&'static str, &str),
    ) -> anyhow::Result<String> {
        let mut req = http::Request::get(url);
        if let Some(a) = accept {
            req = req.header(http::header::ACCEPT, a);
        }
        let req = req.body(Vec::new())?;
        match tokio::time::timeout(self.timeout, self.client.request_text(req)).await {
            Ok(r) => r.map_err(|e| denied_or(e, "list", resource, scope)),
            Err(_) => anyhow::bail!(
                "list {resource} ({scope}): the API server did not answer within {:?}",
                self.timeout
            ),
        }
    }
}
