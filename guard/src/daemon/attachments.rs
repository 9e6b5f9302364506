//! Which interfaces are guarded, as links, addresses and routes come and go.
//!
//! The choice is `model::uplinks`' (names and globs of `--interface`, and
//! with `auto` the devices the node's routes, its Node address and the
//! announcers' objects point at). This keeps the program attached where
//! the choice says: a device that joins the choice gets the program (also
//! re-created with a new ifindex, or renamed into a pattern) before one that
//! leaves it loses it, so that a change of uplink never leaves a moment
//! when neither is guarded; one that disappears is forgotten. A pattern that
//! matches nothing is a warning, not an error: the interface may come later.

use std::collections::BTreeMap;

use tokio::sync::watch;

use super::RunConfig;
use crate::{
    datapath::{
        attach::{AttachHow, AttachMode},
        Datapath,
    },
    model::{
        addrs::AddrTable,
        uplinks::{self, Ask, Choice, Hints},
    },
    sources::{cluster::store::Announcer, uplink_hints},
    telemetry::status::{ChosenBy, Interface, InterfaceState},
};

/// One interface the guard is attached to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attached {
    pub ifindex: u32,
    pub how: AttachHow,
    /// How the census is on this interface's ingress (None: it is not).
    pub census: Option<AttachHow>,
}

/// What is attached where, kept equal to the choice.
#[derive(Debug)]
pub struct Attachments {
    ask: Ask,
    how: AttachMode,
    /// The uplinks as last chosen.
    pub choice: Choice,
    /// Interface name -> where and how the guard is attached.
    pub attached: BTreeMap<String, Attached>,
    /// Interfaces whose attach failed at the last sync, with why.
    pub failed: BTreeMap<String, String>,
}

impl Attachments {
    pub fn new(values: &[String], exclude: &[String], how: AttachMode) -> Self {
        Attachments {
            ask: Ask::new(values, exclude),
            how,
            choice: Choice::default(),
            attached: BTreeMap::new(),
            failed: BTreeMap::new(),
        }
    }

    /// Choose the uplinks again from `table` and `hints` (pure: nothing is
    /// attached yet); whether the choice changed. Said in the log when it does.
    pub fn choose(&mut self, table: &AddrTable, hints: &Hints) -> bool {
        let next = uplinks::choose(&self.ask, table, hints, &self.choice);
        if next == self.choice {
            return false;
        }
        say_changes(&self.choice, &next);
        self.choice = next;
        true
    }

    /// Attach where the choice says (new ones first), then take the
    /// program off what left it.
    pub fn sync(&mut self, dp: &mut Datapath, table: &AddrTable) {
        // Renamed: the same device (ifindex) under a new name. Only the
        // record changes; the attachment is untouched.
        let by_index: BTreeMap<u32, String> = (self.choice.uplinks.iter())
            .map(|(n, u)| (u.ifindex, n.clone()))
            .collect();
        let renamed: Vec<(String, String)> = (self.attached.iter())
            .filter_map(|(old, a)| {
                let new = by_index.get(&a.ifindex)?;
                (new != old).then(|| (old.clone(), new.clone()))
            })
            .collect();
        for (old, new) in renamed {
            if let Some(rec) = self.attached.remove(&old) {
                tracing::info!(from = %old, to = %new, "guarded interface renamed; still guarded");
                self.attached.insert(new, rec);
            }
        }
        // What left the choice: gone, re-created (a new ifindex) or no
        // longer chosen. Taken off only after the new ones are on.
        let leaving: Vec<(String, Attached)> = (self.attached.iter())
            .filter(|(name, a)| {
                self.choice.uplinks.get(*name).map(|u| u.ifindex) != Some(a.ifindex)
            })
            .map(|(n, a)| (n.clone(), *a))
            .collect();
        for (name, _) in &leaving {
            self.attached.remove(name);
        }
        self.attach_new(dp);
        for (name, a) in leaving {
            let still_there = table.links.values().any(|i| *i == a.ifindex);
            if !still_there {
                // The kernel removed the attachment with the device.
                dp.forget(a.ifindex);
                tracing::warn!(interface = %name, "guarded interface disappeared; it gets the guard again if it comes back");
            } else if self.attached.values().any(|b| b.ifindex == a.ifindex) {
                // Re-attached under its new name in this very sync.
            } else {
                match dp.detach(a.ifindex) {
                    Ok(()) => {
                        tracing::info!(interface = %name, "interface is no longer an uplink; guard detached")
                    }
                    Err(e) => {
                        tracing::warn!(interface = %name, error = %format!("{e:#}"), "detach failed")
                    }
                }
            }
        }
    }

    /// Attach to the chosen interfaces that are not attached yet.
    fn attach_new(&mut self, dp: &mut Datapath) {
        self.failed.clear();
        let chosen: Vec<(String, u32)> = (self.choice.uplinks.iter())
            .map(|(n, u)| (n.clone(), u.ifindex))
            .collect();
        for (name, ifindex) in chosen {
            if self.attached.contains_key(&name) {
                continue;
            }
            match dp.attach(&name, self.how) {
                Ok(h) => {
                    tracing::info!(interface = %name, attach = h.as_str(), "guard attached to egress");
                    let census = attach_census(dp, &name, ifindex, self.how);
                    let how = h;
                    self.attached.insert(
                        name,
                        Attached {
                            ifindex,
                            how,
                            census,
                        },
                    );
                }
                Err(e) => {
                    tracing::error!(interface = %name, error = %format!("{e:#}"), "cannot attach the guard; will retry on the next link change");
                    self.failed.insert(name, format!("{e:#}"));
                }
            }
        }
    }

    /// Each interface as the status shows it (`carrier`: uplink -> has
    /// carrier).
    pub fn status(&self, carrier: &BTreeMap<String, bool>) -> Vec<Interface> {
        let why = |name: &str| -> Vec<ChosenBy> {
            (self.choice.uplinks.get(name).into_iter())
                .flat_map(|u| u.why.iter())
                .map(|w| ChosenBy {
                    kind: w.label().into(),
                    text: w.to_string(),
                })
                .collect()
        };
        let attached = self.attached.iter().map(|(n, a)| Interface {
            name: n.clone(),
            state: InterfaceState::Attached,
            detail: a.how.as_str().into(),
            census: a.census.map(|h| h.as_str().into()),
            carrier: carrier.get(n).copied(),
            chosen_by: why(n),
        });
        let missing = self.choice.missing.iter().map(|p| Interface {
            name: p.clone(),
            state: InterfaceState::Missing,
            detail: String::new(),
            census: None,
            carrier: None,
            chosen_by: Vec::new(),
        });
        let none_found = self.choice.none_found.iter().map(|said| Interface {
            name: uplinks::AUTO.into(),
            state: InterfaceState::Missing,
            detail: said.clone(),
            census: None,
            carrier: None,
            chosen_by: Vec::new(),
        });
        let failed = self.failed.iter().map(|(n, why_not)| Interface {
            name: n.clone(),
            state: InterfaceState::Failed,
            detail: why_not.clone(),
            census: None,
            carrier: None,
            chosen_by: why(n),
        });
        let skipped = self.choice.left_out.iter().map(|(n, why_not)| Interface {
            name: n.clone(),
            state: InterfaceState::Skipped,
            detail: why_not.clone(),
            census: None,
            carrier: None,
            chosen_by: Vec::new(),
        });
        (attached
            .chain(missing)
            .chain(none_found)
            .chain(failed)
            .chain(skipped))
        .collect()
    }

    /// Why the daemon is not ready, as far as attachments go.
    pub fn not_ready(&self) -> Vec<String> {
        let mut out = Vec::new();
        for p in &self.choice.missing {
            out.push(format!("no interface matches --interface {p}"));
        }
        for (i, why) in &self.failed {
            out.push(format!("attach to {i} failed: {why}"));
        }
        if self.attached.is_empty() {
            match &self.choice.none_found {
                Some(said) => out.push(said.clone()),
                None => out.push("attached to no interface".into()),
            }
        }
        out
    }
}

/// With `--interface auto` and the API: the Node's addresses and the
/// announcers' named interfaces, followed on a task of their own (the
/// routes choose until they come).
pub(super) fn hints(
    cfg: &RunConfig,
    api: Option<&super::report::NodeApi>,
) -> Option<watch::Receiver<crate::model::uplinks::Hints>> {
    let auto = (cfg.daemon.uplinks.iter()).any(|u| u == crate::model::uplinks::AUTO);
    let cluster = cfg.sources.cluster.as_ref().filter(|_| auto)?;
    let api = api?;
    let announcers = &cluster.feed.announcers;
    let follow = uplink_hints::HintsConfig {
        metallb: announcers.iter().find_map(|a| match a {
            Announcer::MetalLb { namespace } => Some(namespace.clone()),
            _ => None,
        }),
        cilium: (announcers.iter()).any(|a| matches!(a, Announcer::Cilium { .. })),
        watch_min: cluster.feed.watch_timeout,
    };
    let (client, dialer) = (api.client.clone(), api.dialer.clone());
    Some(uplink_hints::spawn(follow, client, dialer, api.own.clone()))
}

/// Log what joined and left the uplinks, each with why; a pattern that
/// newly matches nothing; `auto` finding nothing.
fn say_changes(before: &Choice, next: &Choice) {
    for (name, up) in &next.uplinks {
        if before.uplinks.get(name).map(|u| &u.why) != Some(&up.why) {
            tracing::info!(interface = %name, because = %up.because(), "uplink chosen");
        }
    }
    for name in before
        .uplinks
        .keys()
        .filter(|n| !next.uplinks.contains_key(*n))
    {
        let why = next
            .left_out
            .get(name)
            .map_or("gone or no longer pointed at", String::as_str);
        tracing::info!(interface = %name, why, "no longer an uplink");
    }
    for p in next.missing.iter().filter(|p| !before.missing.contains(p)) {
        tracing::warn!(interface = %p, "no interface matches --interface {p} (yet); it is guarded as soon as it appears");
    }
    if let Some(said) = next
        .none_found
        .as_ref()
        .filter(|s| before.none_found.as_ref() != Some(*s))
    {
        tracing::error!("{said}");
    }
}

/// The census on `iface`'s ingress, when it is loaded, attached the way
/// the guard is (`how`). It only observes: a failure is logged and the
/// guard goes on.
fn attach_census(
    dp: &mut Datapath,
    iface: &str,
    ifindex: u32,
    how: AttachMode,
) -> Option<AttachHow> {
    if !dp.census_loaded() {
        return None;
    }
    match dp.attach_census(iface, ifindex, how) {
        Ok(h) => {
            tracing::info!(interface = %iface, attach = h.as_str(), "census attached to ingress (responders, misdirected clients)");
            Some(h)
        }
        Err(e) => {
            tracing::warn!(interface = %iface, error = %format!("{e:#}"), "the census cannot attach here; guarding without it");
            None
        }
    }
}
