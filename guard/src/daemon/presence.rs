//! Presence started for the daemon: the record it publishes is read from
//! the state the main loop publishes (the interfaces it guards, their MACs,
//! its mode and readiness), and what presence reads goes back there for
//! the API and the census.

use std::{collections::BTreeSet, net::IpAddr, sync::Arc};

use guard_common::Mode;

use super::Daemon;
use crate::{
    api::Shared,
    datapath::sys::{ifindex, link_macs_by_index, monotonic_ns},
    model::{
        census::Who,
        fmt_mac,
        kube_events::kernel::answers_now,
        presence::{Iface, Record},
    },
    sources::presence::{self, Handle, Hooks},
};

impl Daemon {
    /// Start presence when configured; a failure to start is said and
    /// guarding goes on without it.
    pub(super) fn start_presence(&self) -> Option<Handle> {
        let mut cfg = self.cfg.presence.clone()?;
        cfg.node = self.node.clone();
        let (read, write, node) = (self.shared.clone(), self.shared.clone(), self.node.clone());
        let hooks = Hooks {
            record: Box::new(move || {
                let st = read.read();
                let macs = link_macs_by_index();
                let interfaces = (st.uplinks.keys())
                    .filter_map(|name| {
                        let mac = macs.get(&ifindex(name).ok()?)?;
                        Some(Iface {
                            name: name.clone(),
                            mac: fmt_mac(mac),
                        })
                    })
                    .collect();
                // The node's other physical NICs (sysfs says which have a
                // device): where an owner answering from the wrong one is.
                let other = (crate::datapath::sys::interface_names().into_iter())
                    .filter(|n| !st.uplinks.contains_key(n))
                    .filter(|n| {
                        std::path::Path::new("/sys/class/net")
                            .join(n)
                            .join("device")
                            .exists()
                    })
                    .filter_map(|name| {
                        let mac = macs.get(&ifindex(&name).ok()?)?;
                        Some(Iface {
                            mac: fmt_mac(mac),
                            name,
                        })
                    })
                    .collect();
                let monitor = st.mode == Some(Mode::Monitor);
                Record {
                    node: node.clone(),
                    mode: if monitor { "monitor" } else { "enforce" }.into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    health: super::report::health(!st.not_ready.is_empty(), st.mode).into(),
                    interfaces,
                    other,
                    kernel_answers: answers_now(st.kernel_answered_ns, monotonic_ns()),
                }
            }),
            publish: Box::new(move |seen| write.write().presence = Some(seen)),
            nodes_wanted: self.shared.nodes_wanted.clone(),
        };
        match presence::start(cfg, hooks, self.shared.ops.clone()) {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "presence cannot start; guarding without it");
                None
            }
        }
    }
}

/// For the census: who the claimants of some LB IPs are, from the
/// presence records and the owners the main loop published.
pub(super) fn who_is(shared: Arc<Shared>) -> crate::telemetry::census::WhoIs {
    Box::new(move |ips: &BTreeSet<IpAddr>| {
        let st = shared.read();
        Who {
            on: st.presence.is_some(),
            macs: (st.presence.as_ref())
                .map(|p| p.table.macs())
                .unwrap_or_default(),
            owners: (ips.iter())
                .filter_map(|ip| Some((*ip, st.ips.get(ip)?.owner.clone()?)))
                .collect(),
        }
    })
}

/// For the healer: the MACs of the owner node's live record for each of
/// `ips`, and every live guard's MACs (None: presence off).
pub(super) fn presence_facts(
    st: &crate::api::state::ApiState,
    ips: &BTreeSet<IpAddr>,
) -> Option<crate::senders::refresh::PresenceFacts> {
    let p = st.presence.as_ref()?;
    Some(crate::senders::refresh::PresenceFacts {
        owner_macs: (ips.iter())
            .filter_map(|ip| {
                let owner = st.ips.get(ip)?.owner.as_deref()?;
                Some((*ip, p.table.macs_of(owner)?))
            })
            .collect(),
        uplink_macs: p.table.macs().into_keys().collect(),
    })
}
