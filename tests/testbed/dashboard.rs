//! The shipped dashboard against what the daemons really exported: every
//! query of `deploy/monitoring/grafana-dashboard.json` is given to the
//! scenario that should make it show something ([`PANELS`]: a firing test
//! of the alerts), and that test has promtool evaluate it on the series it
//! scraped ([`exprs_for`], a `promql_expr_test` beside its alerts): it
//! returns at least one sample that is a number (NaN, which Grafana shows
//! as nothing, does not count).

use std::{path::Path, time::Duration};

use anyhow::{Context as _, Result};
use serde_json::Value;

use crate::promtool::ExprExpect;

const KERNELS: (&str, &str) = ("tests/alerts_fire.rs", "kernels_that_keep_answering_page");
const OWNERS: (&str, &str) = ("tests/alerts_fire.rs", "silent_and_misplaced_owners_page");
const ONE_NODE: (&str, &str) = (
    "tests/alerts_fire_node.rs",
    "a_takeover_stale_clients_and_a_rogue_on_one_node_page",
);
const IPV6: (&str, &str) = (
    "tests/alerts_fire_node.rs",
    "ipv6_the_parser_cannot_follow_pages",
);
const FEED: (&str, &str) = (
    "tests/alerts_fire_feed.rs",
    "a_blind_feed_and_memory_near_the_limit_page",
);

/// Each query of the dashboard (panel id, refId) and the test whose
/// scenario makes it return data (file, test function).
pub const PANELS: &[(u64, &str, (&str, &str))] = &[
    (1, "A", KERNELS),
    (2, "A", KERNELS),
    (3, "A", KERNELS),
    (4, "A", KERNELS),
    (5, "A", KERNELS),
    (6, "A", KERNELS),
    (7, "A", KERNELS),
    (8, "A", KERNELS),
    (9, "A", FEED),
    (10, "A", KERNELS),
    (11, "A", KERNELS),
    (12, "A", KERNELS),
    (13, "A", KERNELS),
    (14, "A", ONE_NODE),
    (14, "B", KERNELS),
    (15, "A", ONE_NODE),
    (15, "B", ONE_NODE),
    (15, "C", ONE_NODE),
    (16, "A", IPV6),
    (16, "B", IPV6),
    (21, "A", ONE_NODE),
    (21, "B", ONE_NODE),
    (22, "A", ONE_NODE),
    (22, "B", ONE_NODE),
    (23, "A", ONE_NODE),
    (24, "A", ONE_NODE),
    (25, "A", KERNELS),
    (25, "B", OWNERS),
    (25, "C", KERNELS),
    (26, "A", KERNELS),
    (26, "B", FEED),
    (27, "A", KERNELS),
    (28, "A", OWNERS),
    (28, "B", OWNERS),
    (29, "A", OWNERS),
    (29, "B", OWNERS),
    (29, "C", OWNERS),
];

/// One query of the dashboard.
#[derive(Debug, Clone)]
pub struct Query {
    pub panel: u64,
    pub ref_id: String,
    pub title: String,
    pub expr: String,
}

/// Every query of the shipped dashboard.
pub fn queries() -> Result<Vec<Query>> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring/grafana-dashboard.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    let dash: Value = serde_json::from_str(&text).context("the dashboard")?;
    let mut out = Vec::new();
    for p in dash["panels"].as_array().into_iter().flatten() {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(Query {
                panel: p["id"].as_u64().unwrap_or_default(),
                ref_id: t["refId"].as_str().unwrap_or_default().to_owned(),
                title: p["title"].as_str().unwrap_or_default().to_owned(),
                expr: t["expr"].as_str().unwrap_or_default().to_owned(),
            });
        }
    }
    Ok(out)
}

/// The queries given to `test` of `file`, each expected to return data at
/// `at`: a number in at least one series (`count(Q == Q) > bool 0` is 1).
pub fn exprs_for(file: &str, test: &str, at: Duration) -> Result<Vec<ExprExpect>> {
    let mine: Vec<(u64, &str)> = (PANELS.iter())
        .filter(|(_, _, (f, t))| file.ends_with(f.trim_start_matches("tests/")) && *t == test)
        .map(|(p, r, _)| (*p, *r))
        .collect();
    Ok((queries()?.into_iter())
        .filter(|q| mine.contains(&(q.panel, q.ref_id.as_str())))
        .map(|q| ExprExpect {
            at,
            expr: format!("count(({0}) == ({0})) > bool 0", q.expr),
            samples: vec![("{}".to_owned(), 1.0)],
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every query of the dashboard is given to exactly one test, every
    /// row is a query of the dashboard, and every test named exists.
    #[test]
    fn every_query_has_one_scenario_that_exists() {
        let q = queries().unwrap();
        for x in &q {
            let n = (PANELS.iter())
                .filter(|(p, r, _)| *p == x.panel && *r == x.ref_id)
                .count();
            assert_eq!(
                n, 1,
                "panel {} {} ({}): {n} rows",
                x.panel, x.ref_id, x.title
            );
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for (p, r, (file, test)) in PANELS {
            assert!(
                q.iter().any(|x| x.panel == *p && x.ref_id == *r),
                "no query {p} {r} in the dashboard"
            );
            let text = std::fs::read_to_string(root.join(file)).unwrap_or_default();
            assert!(
                text.contains(&format!("#[test]\nfn {test}()")),
                "no test {test} in {file}"
            );
            // Its proof ([`crate::alerting::Proof::check`]) runs the queries.
            assert!(text.contains("Proof {"), "{file} checks no query");
        }
    }
}
