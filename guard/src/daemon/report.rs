//! This node's findings as its ArpGuardNode carries them
//! (`guard_wire::node::NodeReport`), built from what the main loop, the
//! census and the clients' reader published for the local API: the same
//! facts `/status` serves, so `kubectl arp-guard status` reads from the API
//! what it used to ask each guard. Pure over the state and two clocks; the
//! writer (`sources::report`) decides when it goes out.

use std::net::IpAddr;

use guard_common::{Mode, Ownership};
use guard_wire::node::{Clients, Conflict, NodeReport, OwnedIp, Takeover, Uplink, MAX_ROWS};

use crate::{
    api::{state::ApiState, types::ConflictRow},
    model::presence::{self, Whose},
    telemetry::status::InterfaceState,
};

/// Claimants of one IP named at most.
const CLAIMANTS: usize = 16;
/// The longest `notReady` line kept.
const LINE: usize = 1024;

/// The health word presence and the report both say: `degraded` while not
/// ready, else what the mode does.
pub(super) fn health(not_ready: bool, mode: Option<Mode>) -> &'static str {
    match (not_ready, mode == Some(Mode::Monitor)) {
        (true, _) => "degraded",
        (false, true) => "monitoring",
        (false, false) => "enforcing",
    }
}

/// RFC 3339 of a Unix time (seconds).
fn rfc3339(unix: u64) -> Option<String> {
    let t = jiff::Timestamp::from_second(i64::try_from(unix).ok()?).ok()?;
    Some(t.to_string())
}

/// The report of `st` now (`now_wall_ns`, since the Unix epoch, and
/// `now_mono_ns` the same instant, to turn the census's monotonic times
/// into wall-clock ones).
pub(super) fn build(st: &ApiState, now_wall_ns: u64, now_mono_ns: u64) -> NodeReport {
    let mode = st.mode;
    let mut r = NodeReport {
        mode: if mode == Some(Mode::Monitor) {
            "monitor"
        } else {
            "enforce"
        }
        .into(),
        health: health(!st.not_ready.is_empty(), mode).into(),
        version: env!("CARGO_PKG_VERSION").into(),
        not_ready: (st.not_ready.iter())
            .map(|l| crate::model::text::clip(l, LINE))
            .collect(),
        ..Default::default()
    };
    let interfaces = (st.status.iter()).flat_map(|s| s.interfaces.iter());
    r.uplinks = interfaces
        .filter(|i| i.state == InterfaceState::Attached)
        .map(|i| Uplink {
            name: i.name.clone(),
            chosen_by: i.chosen_by.iter().map(|c| c.text.clone()).collect(),
        })
        .collect();
    r.uplink_names = (r.uplinks.iter().map(|u| u.name.as_str()))
        .collect::<Vec<_>>()
        .join(",");
    let owned: Vec<OwnedIp> = (st.ips.iter())
        .filter(|(_, e)| e.state == Ownership::Owned)
        .map(|(ip, e)| OwnedIp {
            ip: *ip,
            service: e.service.clone(),
            takeover: st.takeovers.get(ip).and_then(|t| {
                Some(Takeover {
                    at: rfc3339(t.at_unix)?,
                    first_announcement_ms: t.first_announcement_ms,
                    silent: t.silent,
                })
            }),
        })
        .collect();
    r.last_takeover = (owned.iter().filter_map(|o| o.takeover.as_ref()))
        .map(|t| t.at.clone())
        .max();
    r.owned_count = owned.len();
    r.conflicts = conflicts(st);
    r.conflict_count = r.conflicts.len();
    r.clients = clients(st, now_wall_ns, now_mono_ns);
    r.stale_clients = r.clients.iter().map(|c| c.stale).sum();
    r.owned = owned;
    r.truncated = [r.owned.len(), r.conflicts.len(), r.clients.len()]
        .iter()
        .any(|n| *n > MAX_ROWS);
    r.owned.truncate(MAX_ROWS);
    r.conflicts.truncate(MAX_ROWS);
    r.clients.truncate(MAX_ROWS);
    r
}

/// The census's conflicts, each claimant named by its node where a guard
/// lists the MAC.
fn conflicts(st: &ApiState) -> Vec<Conflict> {
    let Some(census) = st.census.as_ref() else {
        return Vec::new();
    };
    let macs = (st.presence.as_ref())
        .map(|p| p.table.macs())
        .unwrap_or_default();
    (ConflictRow::all(census).into_iter())
        .map(|c| {
            let mut claimants: Vec<String> = (c.macs.iter())
                .map(
                    |m| match presence::parse_mac(m).map(|b| presence::whose(&macs, &b)) {
                        Some(Whose::Node { node, .. }) => node,
                        _ => format!("{m} (no guard lists it)"),
                    },
                )
                .collect();
            claimants.sort();
            claimants.dedup();
            claimants.truncate(CLAIMANTS);
            Conflict {
                ip: c.ip,
                reason: c.reason.as_str().into(),
                claimants,
            }
        })
        .collect()
}

/// The IPs whose clients still send here, each with since when this node
/// no longer owns it (the monotonic moment of the loss turned into wall
/// time in nanoseconds, then whole seconds: the same second at every
/// build, so a report does not change by itself).
fn clients(st: &ApiState, now_wall_ns: u64, now_mono_ns: u64) -> Vec<Clients> {
    let Some(doc) = st.clients.as_ref() else {
        return Vec::new();
    };
    let since = |ip: &IpAddr| {
        let lost = *st.lost.get(ip)?;
        let at_ns = now_wall_ns.checked_sub(now_mono_ns.checked_sub(lost)?)?;
        rfc3339(at_ns / 1_000_000_000)
    };
    (crate::api::types::ClientsRow::all(doc).into_iter())
        .map(|c| Clients {
            since: since(&c.ip),
            ip: c.ip,
            sending: c.sending,
            stale: c.stale,
        })
        .collect()
}

/// The API as the small tasks about this node use it: one client, one
/// dialer for watches, and the Node as it was read (once).
pub(super) struct NodeApi {
    pub client: kube::Client,
    pub dialer: crate::sources::cluster::dial::Dialer,
    pub own: tokio::sync::watch::Receiver<Option<crate::sources::own_node::OwnNode>>,
}

/// With the Kubernetes API configured: its client for this node's own
/// business, and the Node read on a task of its own. Without one (or when
/// it cannot be configured, said): None, and nothing of it runs.
pub(super) async fn node_api(cfg: &super::RunConfig, node: &str) -> Option<NodeApi> {
    let c = cfg.sources.cluster.as_ref()?;
    match crate::sources::cluster::task::connections(c.kubeconfig.as_deref()).await {
        Ok((client, dialer)) => Some(NodeApi {
            own: crate::sources::own_node::spawn(client.clone(), node.to_owned()),
            client,
            dialer,
        }),
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "no Kubernetes client for this node's Node, uplink hints and findings");
            None
        }
    }
}

/// Findings are not published in this guard's first seconds while it is
/// not ready (its feed not synced): a restart with nothing changed writes
/// nothing at all.
const STARTUP_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

impl super::Daemon {
    /// Start the writer of this node's ArpGuardNode (`--node-report-interval`).
    pub(super) fn start_report(&mut self, api: Option<&NodeApi>) {
        let (Some(api), Some(interval)) = (api, self.cfg.node_report) else {
            return;
        };
        let (tx, rx) = tokio::sync::watch::channel(NodeReport::default());
        let cfg = crate::sources::report::ReportConfig {
            node: self.node.clone(),
            interval,
        };
        let ops = self.shared.ops.clone();
        crate::sources::report::spawn(cfg, api.client.clone(), api.own.clone(), rx, ops);
        self.report = Some((tx, std::time::Instant::now()));
    }

    /// Hand the writer this node's findings as they are now (it writes
    /// only what differs from what the API holds).
    pub(super) fn refresh_report(&self) {
        let Some((tx, started)) = &self.report else {
            return;
        };
        let st = self.shared.read();
        if !st.not_ready.is_empty() && started.elapsed() < STARTUP_GRACE {
            return;
        }
        let wall_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let r = build(&st, wall_ns, crate::datapath::monotonic_ns());
        drop(st);
        tx.send_if_modified(|cur| {
            let changed = cur.content() != r;
            if changed {
                *cur = r;
            }
            changed
        });
    }
}
