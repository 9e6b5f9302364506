//! What the daemon tells the world: the state it publishes for the API and
//! --status-file (built once per change), and its log lines about changes,
//! map writes and counters.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use super::{status_file, Daemon};
use crate::{
    api::state::{ip_entries, note_losses, update_ip_entries},
    datapath::Datapath,
    model::{
        cluster::ClusterView,
        ownership::OwnershipFile,
        view::{LbIp, View},
    },
    ops::{ErrorCause, Ops},
    telemetry::{
        counters::Snapshot,
        status::{counts, feed_health, DaemonStatus},
    },
};

/// What a change did to the view.
pub(super) enum Changed {
    Nothing,
    /// These LB IPs, and nothing else.
    Keys(BTreeSet<IpAddr>),
    /// Derived anew: anything may have changed.
    All,
}

impl Daemon {
    /// Each uplink and whether its device has carrier. A device not (yet)
    /// in the address table counts as up: the guard never reports a fault
    /// it has not seen.
    fn carrier(&self) -> BTreeMap<String, bool> {
        (self.attachments.attached.iter())
            .map(|(n, a)| {
                let dev = self.addrs.devices.get(&a.ifindex);
                (n.clone(), dev.is_none_or(|d| d.carrier))
            })
            .collect()
    }

    /// The status document and the API's state, from the current view,
    /// attachments and feed.
    pub(super) fn publish(&mut self, cluster: Option<&ClusterView>, changed: &Changed) {
        let att = &self.attachments;
        let guards = (self.shared.read().presence.as_ref()).map(|p| p.table.clone());
        let carrier = self.carrier();
        let owned = self.view.count(guard_common::Ownership::Owned);
        let owner_link_down = crate::model::uplinks::link_down(&carrier, owned);
        let status = DaemonStatus {
            node: self.node.clone(),
            mode: self.cfg.datapath.mode.as_str().into(),
            interfaces: att.status(&carrier),
            lb_ips: counts(&self.view),
            not_enforced: self.dp.not_enforced(),
            map_memory_bytes: self.memlock,
            feed: cluster.map(|c| feed_health(&self.announcers, c, &self.node, guards.as_deref())),
            // The memory watch's sample (set again under the write lock
            // below, where a newer one cannot be overwritten).
            memory: self.shared.read().memory.clone(),
            owner_link_down,
        };
        if let Some(path) = &self.cfg.daemon.status_file {
            status_file::publish(path, &status, &mut self.last_status);
        }
        let not_ready = not_ready(att, cluster);
        let ifnames: BTreeMap<u32, String> = att
            .attached
            .iter()
            .map(|(n, a)| (a.ifindex, n.clone()))
            .collect();
        let shared = self.shared.clone();
        let mut guard = shared.write();
        let st = &mut *guard;
        let now_ns = crate::datapath::monotonic_ns();
        match changed {
            Changed::Keys(keys) if !st.ips.is_empty() => {
                note_losses(&mut st.lost, &st.ips, &self.view, keys.iter(), now_ns);
                update_ip_entries(&mut st.ips, &self.view, keys, &ifnames)
            }
            Changed::Nothing if !st.ips.is_empty() => {}
            _ => {
                st.lost.retain(|ip, _| self.view.lb.contains_key(ip));
                note_losses(
                    &mut st.lost,
                    &st.ips,
                    &self.view,
                    self.view.lb.keys(),
                    now_ns,
                );
                st.ips = ip_entries(&st.ips, &self.view, &ifnames)
            }
        }
        st.uplinks = att
            .attached
            .iter()
            .map(|(n, a)| (n.clone(), self.view.if_primary.contains_key(&a.ifindex)))
            .collect();
        st.status = Some(DaemonStatus {
            memory: st.memory.clone(),
            ..status
        });
        st.not_ready = not_ready;
        st.mode = Some(self.cfg.datapath.mode);
        st.leak_action = Some(self.cfg.datapath.leak_action);
        st.feed_enabled = cluster.is_some();
        st.feed_failing_since = cluster.and_then(|c| c.failing_since);
        // Settled: derived from every source, the cluster's once synced.
        let settled = cluster.is_none() || self.cluster_flags.is_some_and(|(synced, _)| synced);
        self.take_back_history(st, settled);
        if !st.claims_kept.is_empty() {
            let ips = &st.ips;
            let foreign = |ip: &IpAddr| {
                (ips.get(ip)).is_some_and(|e| e.state == guard_common::Ownership::Foreign)
            };
            st.claims_kept.retain(|ip, _| foreign(ip));
        }
        drop(guard);
        self.publish_takeovers();
    }
}

/// Bring the maps to `view`; false if some entry could not be written (it
/// is retried every second). Entries that did not fit in a full map are
/// reported, and retried on the next change or reconcile.
pub(super) fn apply(dp: &mut Datapath, view: &View, additive: bool, ops: &Ops) -> bool {
    let r = dp.apply(view, additive);
    report(r, ops)
}

/// Log and count what an apply did and could not do; false if some entry
/// could not be written (other than for a full map).
fn report(r: crate::datapath::maps::ApplyReport, ops: &Ops) -> bool {
    let full: Vec<String> = r.full().map(|f| f.entry.clone()).collect();
    if !full.is_empty() {
        tracing::warn!(
            count = full.len(),
            first = ?&full[..full.len().min(10)],
            "map full: these entries are not in the kernel; an LB IP that did not fit is not guarded (its frames pass)"
        );
        ops.error(ErrorCause::MapFull);
    }
    ops.map_writes
        .fetch_add(r.written as u64, std::sync::atomic::Ordering::Relaxed);
    ops.map_removes
        .fetch_add(r.removed as u64, std::sync::atomic::Ordering::Relaxed);
    let mut ok = true;
    for e in r.errors() {
        ok = false;
        ops.error(ErrorCause::MapWrite);
        tracing::error!(error = %e, "map update failed; that entry keeps its previous value");
    }
    tracing::debug!(written = r.written, removed = r.removed, "maps updated");
    ok
}

/// Bring only the LB entries `keys` (and the uplinks' addresses)
/// to `view`; false if some entry could not be written.
pub(super) fn apply_changes(
    dp: &mut Datapath,
    view: &View,
    keys: &BTreeSet<std::net::IpAddr>,
    additive: bool,
    ops: &Ops,
) -> bool {
    let r = dp.apply_changes(view, keys, additive);
    report(r, ops)
}

/// One line per LB IP added, removed or whose state changed.
pub(super) fn log_changes(old: &View, new: &View) {
    for (ip, l) in &new.lb {
        log_change(*ip, old.lb.get(ip), Some(l));
    }
    for ip in old.lb.keys().filter(|ip| !new.lb.contains_key(ip)) {
        log_change(*ip, old.lb.get(ip), None);
    }
}

/// The line for one LB IP that was added, removed or changed state.
pub(super) fn log_change(ip: std::net::IpAddr, old: Option<&LbIp>, new: Option<&LbIp>) {
    match (old, new) {
        (Some(o), Some(l)) if o.state == l.state => {}
        (Some(o), Some(l)) => {
            tracing::info!(lb_ip = %ip, from = o.state.as_str(), to = l.state.as_str(), source = %l.source, "ownership changed")
        }
        (None, Some(l)) => {
            tracing::info!(lb_ip = %ip, state = l.state.as_str(), source = %l.source, "LB IP added")
        }
        (Some(_), None) => tracing::info!(lb_ip = %ip, "LB IP removed"),
        (None, None) => {}
    }
}

pub(super) fn log_counters(dp: &Datapath, what: &str) {
    match Snapshot::of_datapath(dp) {
        Ok(s) => tracing::info!(counters = %s.summary(), "{what}"),
        Err(e) => tracing::warn!(error = %format!("{e:#}"), "cannot read counters"),
    }
}

/// A node name that matches no owner in the file is most likely a typo.
pub(super) fn warn_if_node_unknown(node: &str, file: Option<&OwnershipFile>) {
    let Some(file) = file else { return };
    let owners: BTreeSet<&str> = file
        .ips
        .values()
        .filter_map(|e| e.owner.as_deref())
        .collect();
    if !owners.is_empty() && !owners.contains(node) {
        tracing::info!(
            node = %node,
            owners = ?owners,
            "this node owns no IP in the ownership file; if it should, check --node-name/NODE_NAME"
        );
    }
}

/// Why the daemon is not ready: its attachments', and the feed's.
fn not_ready(att: &super::attachments::Attachments, cluster: Option<&ClusterView>) -> Vec<String> {
    let mut not_ready = att.not_ready();
    if cluster.is_some_and(|c| !c.synced) {
        not_ready.push("Kubernetes feed not synced yet".into());
    }
    if let Some(p) = cluster.and_then(|c| c.problem.as_ref()) {
        not_ready.push(p.clone());
    }
    not_ready
}
