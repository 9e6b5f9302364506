//! Which interfaces are guarded, as links come and go.
//!
//! `--interface` takes names or glob patterns (`eth*`, `bond0.*`, `en?1`).
//! Every change of the link table is compared with what is attached: a
//! matching interface that appears (also re-created with a new ifindex, or
//! renamed into a pattern) gets the program; one that disappears or is
//! renamed away is forgotten or detached. A pattern that matches nothing is a
//! warning, not an error: the interface may come later.

use std::collections::BTreeMap;

use crate::{
    datapath::{
        attach::{AttachHow, AttachMode},
        Datapath,
    },
    model::addrs::AddrTable,
    telemetry::status::{Interface, InterfaceState},
};

/// `*` matches any run of characters, `?` one character; everything else itself.
pub fn glob(pattern: &str, name: &str) -> bool {
    fn m(p: &[u8], n: &[u8]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some(b'*'), _) => m(&p[1..], n) || (!n.is_empty() && m(p, &n[1..])),
            (Some(b'?'), Some(_)) => m(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => m(&p[1..], &n[1..]),
            _ => false,
        }
    }
    m(pattern.as_bytes(), name.as_bytes())
}

/// Interfaces of `table` that some pattern names, except those excluded
/// (the LB IP source interfaces, which never answer the segment).
pub fn wanted(patterns: &[String], exclude: &[String], table: &AddrTable) -> BTreeMap<String, u32> {
    table
        .links
        .iter()
        .filter(|(name, _)| !exclude.contains(name) && patterns.iter().any(|p| glob(p, name)))
        .map(|(n, i)| (n.clone(), *i))
        .collect()
}

/// One interface the guard is attached to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attached {
    pub ifindex: u32,
    pub how: AttachHow,
    /// How the census is on this interface's ingress (None: it is not).
    pub census: Option<AttachHow>,
}

/// What is attached where, kept equal to [`wanted`].
#[derive(Debug)]
pub struct Attachments {
    /// `--interface` patterns, the interfaces excluded from them, and how to attach.
    patterns: Vec<String>,
    exclude: Vec<String>,
    how: AttachMode,
    /// Interface name -> where and how the guard is attached.
    pub attached: BTreeMap<String, Attached>,
    /// Patterns that matched nothing at the last sync (shown in the status).
    pub missing: Vec<String>,
    /// Interfaces whose attach failed at the last sync, with why.
    pub failed: BTreeMap<String, String>,
}

impl Attachments {
    pub fn new(patterns: &[String], exclude: &[String], how: AttachMode) -> Self {
        Attachments {
            patterns: patterns.to_vec(),
            exclude: exclude.to_vec(),
            how,
            attached: BTreeMap::new(),
            missing: Vec::new(),
            failed: BTreeMap::new(),
        }
    }

    /// Attach to what appeared, forget what vanished, detach what no longer matches.
    pub fn sync(&mut self, dp: &mut Datapath, table: &AddrTable) {
        let want = wanted(&self.patterns, &self.exclude, table);
        // Renamed within the patterns: the same device (ifindex), a new name.
        // Only the record changes; the attachment is untouched.
        let renamed: Vec<(String, String)> = self
            .attached
            .iter()
            .filter(|(name, a)| !want.contains_key(*name) && want.values().any(|i| *i == a.ifindex))
            .filter_map(|(old, a)| {
                want.iter()
                    .find(|(_, i)| **i == a.ifindex)
                    .map(|(new, _)| (old.clone(), new.clone()))
            })
            .collect();
        for (old, new) in renamed {
            if let Some(rec) = self.attached.remove(&old) {
                tracing::info!(from = %old, to = %new, "guarded interface renamed; still guarded");
                self.attached.insert(new, rec);
            }
        }
        // Gone, re-created (new ifindex) or renamed away.
        let stale: Vec<(String, u32)> = self
            .attached
            .iter()
            .filter(|(name, a)| want.get(*name) != Some(&a.ifindex))
            .map(|(n, a)| (n.clone(), a.ifindex))
            .collect();
        for (name, ifindex) in stale {
            self.attached.remove(&name);
            let still_there = table.links.values().any(|i| *i == ifindex);
            if still_there {
                // Renamed to a name no pattern matches: take the program off.
                match dp.detach(ifindex) {
                    Ok(()) => {
                        tracing::info!(interface = %name, "interface no longer matches --interface; guard detached")
                    }
                    Err(e) => {
                        tracing::warn!(interface = %name, error = %format!("{e:#}"), "detach failed")
                    }
                }
            } else {
                // The kernel removed the attachment with the device.
                dp.forget(ifindex);
                tracing::warn!(interface = %name, "guarded interface disappeared; it gets the guard again if it comes back");
            }
        }
        self.attach_new(dp, &want);
        let missing: Vec<String> = self
            .patterns
            .iter()
            .filter(|p| !want.keys().any(|n| glob(p, n)))
            .cloned()
            .collect();
        for p in missing.iter().filter(|p| !self.missing.contains(p)) {
            tracing::warn!(interface = %p, "no interface matches --interface {p} (yet); it is guarded as soon as it appears");
        }
        self.missing = missing;
    }

    /// Attach to the wanted interfaces that are not attached yet.
    fn attach_new(&mut self, dp: &mut Datapath, want: &BTreeMap<String, u32>) {
        self.failed.clear();
        for (name, ifindex) in want {
            if self.attached.contains_key(name) {
                continue;
            }
            match dp.attach(name, self.how) {
                Ok(h) => {
                    tracing::info!(interface = %name, attach = h.as_str(), "guard attached to egress");
                    let census = attach_census(dp, name, *ifindex, self.how);
                    self.attached.insert(
                        name.clone(),
                        Attached {
                            ifindex: *ifindex,
                            how: h,
                            census,
                        },
                    );
                }
                Err(e) => {
                    tracing::error!(interface = %name, error = %format!("{e:#}"), "cannot attach the guard; will retry on the next link change");
                    self.failed.insert(name.clone(), format!("{e:#}"));
                }
            }
        }
    }

    /// Each interface as the status shows it.
    pub fn status(&self) -> Vec<Interface> {
        let attached = self.attached.iter().map(|(n, a)| Interface {
            name: n.clone(),
            state: InterfaceState::Attached,
            detail: a.how.as_str().into(),
            census: a.census.map(|h| h.as_str().into()),
        });
        let missing = self.missing.iter().map(|p| Interface {
            name: p.clone(),
            state: InterfaceState::Missing,
            detail: String::new(),
            census: None,
        });
        let failed = self.failed.iter().map(|(n, why)| Interface {
            name: n.clone(),
            state: InterfaceState::Failed,
            detail: why.clone(),
            census: None,
        });
        attached.chain(missing).chain(failed).collect()
    }

    /// Why the daemon is not ready, as far as attachments go.
    pub fn not_ready(&self) -> Vec<String> {
        let mut out = Vec::new();
        for p in &self.missing {
            out.push(format!("no interface matches --interface {p}"));
        }
        for (i, why) in &self.failed {
            out.push(format!("attach to {i} failed: {why}"));
        }
        if self.attached.is_empty() {
            out.push("attached to no interface".into());
        }
        out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("eth0", "eth0"));
        assert!(!glob("eth0", "eth01"));
        assert!(glob("eth*", "eth0") && glob("eth*", "eth") && !glob("eth*", "veth0"));
        assert!(glob("bond0.*", "bond0.100") && !glob("bond0.*", "bond0"));
        assert!(glob("en?1", "enp1") && !glob("en?1", "en1"));
        assert!(glob("*", "anything") && glob("*0", "eth0"));
    }

    #[test]
    fn wanted_follows_the_table() {
        let mut t = AddrTable::default();
        for (n, i) in [("eth0", 2), ("eth1", 3), ("kube-ipvs0", 4), ("lo", 1)] {
            t.links.insert(n.into(), i);
        }
        let w = wanted(
            &["eth*".into(), "kube-*".into()],
            &["kube-ipvs0".into()],
            &t,
        );
        assert_eq!(
            w.into_iter().collect::<Vec<_>>(),
            vec![("eth0".into(), 2), ("eth1".into(), 3)]
        );
    }
}
