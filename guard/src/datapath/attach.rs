//! Putting the program on an interface's egress and taking it off: TCX links
//! (first in the chain, pinned for a no-gap restart) or a netlink clsact
//! filter in arp-guard's fixed slot; leaving them for the next daemon.

use std::io;

use aya::programs::{tc, LinkOrder, SchedClassifier, TcAttachType};

use super::{
    error::{errno, Blame as _, DatapathError, Result},
    map_data::map_data_mut,
    pins,
    sys::ifindex,
    Datapath,
};

/// How to attach (from `--attach`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachMode {
    /// TCX where the kernel has it (Linux >= 6.6), else netlink.
    Auto,
    Tcx,
    Netlink,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachHow {
    Tcx,
    Netlink,
}

impl AttachHow {
    pub fn as_str(self) -> &'static str {
        match self {
            AttachHow::Tcx => "tcx",
            AttachHow::Netlink => "netlink-clsact",
        }
    }
}

#[derive(Debug)]
pub struct Attachment {
    pub iface: String,
    pub ifindex: u32,
    link: AttachLink,
}

/// Who holds an attachment.
#[derive(Debug)]
enum AttachLink {
    /// The loaded program (netlink filters, and TCX links without pinning).
    Owned(tc::SchedClassifierLinkId),
    /// A TCX link pinned at `path`; our handle keeps an fd to it, the pin
    /// keeps it alive after us.
    Pinned {
        link: aya::programs::links::FdLink,
        path: std::path::PathBuf,
    },
}

impl Datapath {
    /// Attach to the egress of `iface`.
    pub fn attach(&mut self, iface: &str, how: AttachMode) -> Result<AttachHow> {
        let pin_dir = self.pin_dir.clone();
        let prog = self.program_mut()?;
        // First in the chain at attach time: a program that returns TCX_PASS
        // (Cilium's egress programs do) ends the chain, and the guard must have
        // seen the frame by then. The guard returns TCX_NEXT for what it passes.
        let tcx = || tc::TcAttachOptions::TcxOrder(LinkOrder::first());
        let netlink =
            |prog: &mut SchedClassifier| attach_netlink(prog, iface, TcAttachType::Egress);
        let index = ifindex(iface)?;
        if let (Some(dir), false) = (&pin_dir, how == AttachMode::Netlink) {
            match attach_pinned_tcx(prog, iface, index, dir) {
                Ok(link) => {
                    self.attached.push(Attachment {
                        iface: iface.to_owned(),
                        ifindex: index,
                        link,
                    });
                    return Ok(AttachHow::Tcx);
                }
                Err(e) if how == AttachMode::Tcx => return Err(e),
                Err(e) => {
                    tracing::info!(interface = iface, error = %format!("{e:#}"), "TCX attach failed; falling back to a netlink clsact filter")
                }
            }
        }
        let (link, how) = match how {
            AttachMode::Tcx => (
                prog.attach_with_options(iface, TcAttachType::Egress, tcx())
                    .map_err(|e| tcx_error(iface, e))?,
                AttachHow::Tcx,
            ),
            AttachMode::Netlink => (netlink(prog)?, AttachHow::Netlink),
            AttachMode::Auto => {
                match prog.attach_with_options(iface, TcAttachType::Egress, tcx()) {
                    Ok(link) => (link, AttachHow::Tcx),
                    Err(tcx_err) => {
                        tracing::info!(interface = iface, error = %tcx_err, "TCX attach failed; falling back to a netlink clsact filter");
                        (netlink(prog)?, AttachHow::Netlink)
                    }
                }
            }
        };
        self.attached.push(Attachment {
            iface: iface.to_owned(),
            ifindex: index,
            link: AttachLink::Owned(link),
        });
        Ok(how)
    }

    /// Detach from one interface that is still there.
    pub fn detach(&mut self, ifindex: u32) -> Result<()> {
        self.detach_census(ifindex);
        let Some(pos) = self.attached.iter().position(|a| a.ifindex == ifindex) else {
            return Ok(());
        };
        let a = self.attached.remove(pos);
        self.release(a.link, true)
    }

    /// Let go of an attachment. `detach`: take the guard off the interface
    /// (and remove its pin); else leave it in place (pinned TCX link, or a
    /// netlink filter) for the next daemon to take over.
    fn release(&mut self, link: AttachLink, detach: bool) -> Result<()> {
        match link {
            AttachLink::Owned(id) => {
                let prog = self.program_mut()?;
                if detach {
                    prog.detach(id)?;
                } else {
                    // Taken out of the program and forgotten, so that unloading
                    // the program does not remove the filter.
                    std::mem::forget(prog.take_link(id)?);
                }
            }
            AttachLink::Pinned { link, path } => {
                if detach {
                    match std::fs::remove_file(&path) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => return Err(e).at_path("removing", &path),
                    }
                }
                // Our fd goes; without the pin this was the last reference.
                drop(link);
            }
        }
        Ok(())
    }

    /// Drop the record of an attachment whose device is gone (the kernel
    /// removed the attachment with it).
    pub fn forget(&mut self, ifindex: u32) {
        self.detach_census(ifindex);
        let (gone, keep): (Vec<Attachment>, Vec<Attachment>) = std::mem::take(&mut self.attached)
            .into_iter()
            .partition(|a| a.ifindex == ifindex);
        self.attached = keep;
        for a in gone {
            // The kernel side is gone with the device; drop ours (and a stale pin).
            let _ = self.release(a.link, true);
        }
    }

    /// Detach from every interface. Also happens on drop; explicit so that
    /// errors can be logged.
    pub fn detach_all(&mut self) -> Vec<(String, Result<()>)> {
        self.detach_census_all();
        let attached = std::mem::take(&mut self.attached);
        let mut out: Vec<(String, Result<()>)> = attached
            .into_iter()
            .map(|a| (a.iface, self.release(a.link, true)))
            .collect();
        if let Some(dir) = self.pin_dir.clone() {
            out.push((dir.display().to_string(), pins::uninstall(&dir).map(|_| ())));
        }
        out
    }

    /// Leave every attachment and pin in place for the next daemon
    /// (`--on-exit keep`): the program keeps enforcing its last maps, within
    /// the liveness gate's limits.
    pub fn keep_all(&mut self) -> Vec<(String, Result<()>)> {
        // The census only observes, for this daemon: it does not stay.
        self.detach_census_all();
        let attached = std::mem::take(&mut self.attached);
        attached
            .into_iter()
            .map(|a| {
                let r = match a.link {
                    // Its pin is gone (bpffs was lost): pin it again, or the
                    // link goes with our fd. pin() consumes the handle; if it
                    // fails the link detaches, as it would have anyway.
                    AttachLink::Pinned { link, path } if !path.exists() => {
                        link.pin(&path).map(drop).at_path("pinning", &path)
                    }
                    link => self.release(link, false),
                };
                (a.iface, r)
            })
            .collect()
    }

    /// Remove link pins that no attachment of ours uses (interfaces dropped
    /// from `--interface`, or devices gone): their program would otherwise
    /// keep running, unseen, on the shared maps.
    pub fn prune_link_pins(&mut self) -> Vec<String> {
        let Some(dir) = self.pin_dir.clone() else {
            return Vec::new();
        };
        let ours: Vec<std::path::PathBuf> = self
            .attached
            .iter()
            .filter_map(|a| match &a.link {
                AttachLink::Pinned { path, .. } => Some(path.clone()),
                AttachLink::Owned(_) => None,
            })
            .collect();
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut pruned = Vec::new();
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with("link_") || ours.contains(&path) {
                continue;
            }
            match aya::programs::links::PinnedLink::from_pin(&path).map(|l| l.unpin()) {
                // Unpinned and dropped: detached.
                Ok(Ok(link)) => drop(link),
                _ => {
                    let _ = std::fs::remove_file(&path);
                }
            }
            pruned.push(name);
        }
        pruned
    }

    /// The pins are gone (bpffs unmounted or the directory removed): pin
    /// maps and program again where a bpffs can be had. The datapath itself
    /// never depended on the pins while we run.
    pub fn repin(&mut self) -> Result<()> {
        let Some(dir) = self.pin_dir.clone() else {
            return Ok(());
        };
        pins::ensure_bpffs(&dir)?;
        for (name, ..) in pins::pinned_maps(u32::MAX) {
            let path = pins::map_path(&dir, name);
            if let (false, Some(m)) = (
                path.exists(),
                self.ebpf.map_mut(name).and_then(map_data_mut),
            ) {
                m.pin(&path).at_path("pinning", &path)?;
            }
        }
        pins::pin_program(self.program_mut()?, &dir)?;
        // Links are not pinned again: aya's pin() consumes the only handle
        // and a failure would take the guard off the interface. Our fds keep
        // them attached while we run; the next start attaches afresh.
        Ok(())
    }
}

/// TCX attach with the link pinned at `DIR/link_<ifindex>`. A link pinned
/// there by an earlier daemon is taken over: the new program replaces the old
/// one in that link atomically (BPF_LINK_UPDATE), so the interface is never
/// unguarded.
fn attach_pinned_tcx(
    prog: &mut SchedClassifier,
    iface: &str,
    index: u32,
    dir: &std::path::Path,
) -> Result<AttachLink> {
    use aya::programs::links::{FdLink, PinnedLink};
    let path = pins::link_path(dir, index);
    let adopted = match PinnedLink::from_pin(&path) {
        Ok(old) => {
            let link: tc::SchedClassifierLink = FdLink::from(old)
                .try_into()
                .at_path("taking over the link (not a TCX link?) pinned at", &path)?;
            Some(
                prog.attach_to_link(link)
                    .at_path("replacing the program in the link pinned at", &path)?,
            )
        }
        Err(_) => None,
    };
    let id = match adopted {
        Some(id) => {
            tracing::info!(interface = iface, pin = %path.display(), "took over the pinned attachment: program replaced atomically");
            id
        }
        None => {
            let _ = std::fs::remove_file(&path); // a stale pin (not a link we can use)
            prog.attach_with_options(
                iface,
                TcAttachType::Egress,
                tc::TcAttachOptions::TcxOrder(LinkOrder::first()),
            )
            .map_err(|e| tcx_error(iface, e))?
        }
    };
    let link: FdLink = prog
        .take_link(id)?
        .try_into()
        .on_iface("taking the TCX link of", iface)?;
    let link = if path.exists() {
        link
    } else {
        // pin() hands the fd back inside the PinnedLink; we keep it for the
        // life of the daemon, the pin keeps the link after us.
        FdLink::from(link.pin(&path).at_path("pinning", &path)?)
    };
    Ok(AttachLink::Pinned { link, path })
}

fn tcx_error(iface: &str, e: aya::programs::ProgramError) -> DatapathError {
    DatapathError::Tcx {
        iface: iface.to_owned(),
        source: Box::new(e),
    }
}

/// The clsact filter slot arp-guard uses in netlink mode, on egress (the
/// guard) and on ingress (the census). A fixed slot means a filter left
/// behind by a daemon that was killed (netlink filters, unlike TCX links,
/// outlive their process) is found and replaced, not stacked upon.
pub const NETLINK_PRIORITY: u16 = 1;
pub const NETLINK_HANDLE: tc::TcHandle = tc::TcHandle::new(0, 0xa6d0);

/// Which of arp-guard's programs a direction's slot holds.
fn slot_holder(dir: TcAttachType) -> &'static str {
    match dir {
        TcAttachType::Ingress => "census",
        _ => "guard",
    }
}

/// A handle on arp-guard's netlink filter slot on `iface` (it may be empty).
fn our_netlink_slot(iface: &str, dir: TcAttachType) -> io::Result<tc::SchedClassifierLink> {
    tc::SchedClassifierLink::attached(iface, dir, NETLINK_PRIORITY, NETLINK_HANDLE, None)
}

/// Attach `prog` in arp-guard's netlink slot of `iface` in direction `dir`,
/// replacing in place a filter an earlier run left there.
pub(super) fn attach_netlink(
    prog: &mut SchedClassifier,
    iface: &str,
    dir: TcAttachType,
) -> Result<tc::SchedClassifierLinkId> {
    // EEXIST: a clsact qdisc is already there (ours from before, or Cilium's).
    if let Err(e) = tc::qdisc_add_clsact(iface) {
        if errno(&e) != Some(libc::EEXIST) {
            return Err(e).on_iface("adding a clsact qdisc to", iface);
        }
    }
    let options = tc::NlOptions {
        priority: NETLINK_PRIORITY,
        handle: NETLINK_HANDLE,
        ..Default::default()
    };
    let what = slot_holder(dir);
    match prog.attach_with_options(iface, dir, tc::TcAttachOptions::Netlink(options)) {
        Ok(link) => Ok(link),
        Err(e) if errno(&e) == Some(libc::EEXIST) => {
            // Our slot is taken by an earlier run's filter: swap the program in
            // place (one netlink change, no moment without a guard).
            let old = our_netlink_slot(iface, dir)?;
            let link = prog
                .attach_to_link(old)
                .on_iface(format!("replacing the {what} filter left on"), iface)?;
            match dir {
                TcAttachType::Ingress => tracing::info!(
                    interface = iface,
                    "replaced a census filter left behind by an earlier run"
                ),
                _ => tracing::warn!(
                    interface = iface,
                    "replaced an arp-guard filter left behind by an earlier run"
                ),
            }
            Ok(link)
        }
        Err(e) => Err(DatapathError::Netlink {
            iface: iface.to_owned(),
            source: Box::new(e),
        }),
    }
}

/// Remove arp-guard's netlink filter (fixed slot) from `iface` in direction
/// `dir` (egress: the guard; ingress: the census); false if there was none.
pub fn remove_netlink_filter(iface: &str, dir: TcAttachType) -> Result<bool> {
    use aya::programs::links::Link as _;
    match our_netlink_slot(iface, dir)?.detach() {
        Ok(()) => Ok(true),
        // No filter in our slot (ENOENT), or no clsact qdisc at all (the
        // kernel answers EINVAL: "cannot find specified qdisc").
        Err(e) if matches!(errno(&e), Some(libc::ENOENT) | Some(libc::EINVAL)) => Ok(false),
        Err(e) => Err(e).on_iface(
            format!("removing the netlink {} filter from", slot_holder(dir)),
            iface,
        ),
    }
}
