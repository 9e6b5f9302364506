//! `arp-guard run`: start-up checks, attach, then keep the maps equal to the
//! view until SIGTERM/SIGINT, then detach cleanly.

use std::{collections::BTreeSet, sync::Arc};

use anyhow::{bail, Context as _, Result};
use guard_common::{LeakAction, Mode, Ownership};
use tokio::{
    signal::unix::{signal, SignalKind},
    sync::watch,
};

use crate::{
    addrs::{self, AddrTable},
    api,
    cli::{AnnouncerArg, KubeVipElection, Listen, OnExit, RunArgs},
    cluster::{feed, objects::ServiceFilter, Announcer, ClusterView, FeedConfig, Key},
    datapath::{self, Datapath},
    file_source, interfaces,
    ownership_file::{self, OwnershipFile},
    pins, preflight, status,
    view::{self, View},
};

/// The liveness gate's thresholds from the flags.
fn gate(args: &RunArgs) -> datapath::Gate {
    datapath::Gate {
        stale_after: args
            .heartbeat_stale_after
            .or(args.stale_after)
            .unwrap_or(std::time::Duration::from_secs(15)),
        dead_after: args.heartbeat_dead_after,
    }
}

/// Reject flag combinations that cannot do what the user means.
pub fn check_args(args: &RunArgs) -> Result<()> {
    let g = gate(args);
    if g.dead_after <= g.stale_after {
        bail!(
            "--heartbeat-dead-after ({:?}) must be longer than the stale threshold ({:?})",
            g.dead_after,
            g.stale_after
        );
    }
    if args.on_exit == OnExit::Keep && args.pin_dir.is_none() {
        bail!("--on-exit keep needs --pin-dir: without pins the guard cannot outlive the daemon");
    }
    let mut seen = BTreeSet::new();
    for i in &args.interfaces {
        if !seen.insert(i) {
            bail!("--interface {i} is given twice");
        }
    }
    if args.announcers.contains(&AnnouncerArg::File) && args.ownership_file.is_none() {
        bail!("--announcer file needs --ownership-file PATH");
    }
    if args.ownership_file.is_none() && args.lb_ips_from.is_empty() && announcers(args).is_empty() {
        bail!(
            "nothing to enforce: give --announcer cilium|kube-vip|metallb, --ownership-file, and/or --lb-ips-from \
             (e.g. --lb-ips-from kube-ipvs0)"
        );
    }
    for i in &args.lb_ips_from {
        if args.interfaces.contains(i) {
            bail!(
                "--lb-ips-from {i} conflicts with --interface {i}: the LB IPs' own interface is not the one \
                 that answers the segment; guard the uplink and read LB IPs from kube-ipvs0"
            );
        }
    }
    Ok(())
}

/// The cluster announcers asked for, in the order given.
pub fn announcers(args: &RunArgs) -> Vec<Announcer> {
    let mut out = Vec::new();
    for a in &args.announcers {
        let a = match a {
            // The file is its own source (--ownership-file), not an API reader.
            AnnouncerArg::File => continue,
            AnnouncerArg::Cilium => Announcer::Cilium {
                namespace: args.cilium_namespace.clone(),
            },
            AnnouncerArg::KubeVip => match args.kube_vip_election {
                KubeVipElection::PerService => Announcer::KubeVipPerService,
                KubeVipElection::Global => Announcer::KubeVipGlobal {
                    lease: Key::new(args.kube_vip_namespace.clone(), args.kube_vip_lease.clone()),
                },
            },
            AnnouncerArg::Metallb => Announcer::MetalLb {
                namespace: args.metallb_namespace.clone(),
            },
        };
        if !out.contains(&a) {
            out.push(a);
        }
    }
    out
}

pub async fn run(args: RunArgs) -> Result<()> {
    check_args(&args)?;
    preflight::check_capabilities()?;
    let node = preflight::node_name(args.node_name.clone())?;
    for i in &args.lb_ips_from {
        if datapath::ifindex(i).is_err() {
            tracing::warn!(interface = %i, "--lb-ips-from {i}: no such interface (yet); its addresses count once it appears");
        }
    }
    let mode = Mode::from(args.mode);
    let leak_action = LeakAction::from(args.leak_action);

    // The file must be valid at start: there is no "last good state" yet.
    // It is read and parsed while the BPF program loads (a big file takes
    // a few hundred ms), and checked before anything is attached.
    let file_job = args.ownership_file.clone().map(|path| {
        let max = args.ownership_file_max_bytes;
        tokio::spawn(async move {
            let text = file_source::read(&path, max)
                .await
                .context("cannot read the ownership file")?;
            let file = tokio::task::spawn_blocking(move || {
                ownership_file::parse(&path, &text).map(|f| (f, text))
            })
            .await
            .context("parsing the ownership file")?
            .context("invalid ownership file")?;
            Ok::<_, anyhow::Error>(file)
        })
    });

    // Before anything is attached: a signal during start-up must also end in
    // a clean detach, not in the default action.
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    // SIGHUP's default action would kill the daemon: it re-reads everything instead.
    let mut sighup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;

    // A taken port fails the start before anything is loaded or attached.
    let listener = match args.listen {
        Listen::On(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("--listen {addr}"))?,
        ),
        Listen::Off => None,
    };

    let (nl, notifications) = addrs::connect()?;
    let table = addrs::dump(&nl).await?;

    // The Kubernetes feed, when an announcer asks for it. A missing or broken
    // configuration is a start-up error; an unreachable API is not (the feed
    // retries, and its staleness rules apply).
    let cluster_announcers = announcers(&args);
    let (cluster_tx, mut cluster_rx) = watch::channel(ClusterView::default());
    let cluster_on = !cluster_announcers.is_empty();
    let _idle_cluster_tx = if cluster_on {
        let client = feed::client(args.kubeconfig.as_deref(), args.kube_watch_timeout).await?;
        let cfg = FeedConfig {
            announcers: cluster_announcers.clone(),
            filter: ServiceFilter {
                lb_class: args.lb_class.clone(),
                external_ips: args.external_ips,
            },
            selector: args.service_selector.clone(),
            stale_after: args.stale_after,
            watch_timeout: args.kube_watch_timeout,
        };
        let names: Vec<&str> = cluster_announcers.iter().map(Announcer::name).collect();
        tracing::info!(announcers = ?names, "reading ownership from the Kubernetes API");
        tokio::spawn(feed::run(client, cfg, cluster_tx));
        None
    } else {
        Some(cluster_tx)
    };

    let mut dp =
        Datapath::load_pinned(mode, leak_action, args.max_lb_ips, args.pin_dir.as_deref())?;
    let file = match file_job {
        Some(job) => Some(job.await.context("reading the ownership file")??),
        None => None,
    };
    if args.pin_dir.is_some() {
        // Pinned maps carry what the previous daemon wrote: start the diff from there.
        match dp.reload_from_kernel() {
            Ok(n) if n > 0 => tracing::info!(entries = n, "took over pinned maps"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "cannot read the pinned maps"),
        }
    }
    dp.set_gate(gate(&args))?;
    dp.set_event_rate(args.event_rate, args.event_burst)?;
    let file_now = file.as_ref().map(|(f, _)| f.clone());
    let mut view = derive(&node, &args, file_now.as_ref(), &table, None);
    if cluster_on {
        view.hold_previous(|ip| dp.map_state(ip));
    }
    // Fill the maps before attaching: the first frame already meets the policy.
    // Until the Kubernetes feed has synced, entries are only added: pinned
    // maps still hold what the previous daemon learned from the cluster.
    let mut dirty = !report_apply(&mut dp, &view, cluster_on);
    // Only now, with the policy in place, does this daemon vouch for it.
    dp.heartbeat()?;
    warn_if_node_unknown(&node, file_now.as_ref());
    let mut attachments =
        interfaces::Attachments::new(&args.interfaces, &args.lb_ips_from, args.attach);
    attachments.sync(&mut dp, &table);
    let mut links_seen = table.links.clone();
    for pin in dp.prune_link_pins() {
        tracing::info!(pin = %pin, "removed a pinned attachment no --interface asks for");
    }
    // With an explicit --attach that the kernel cannot do, nothing would ever attach.
    if attachments.attached.is_empty() && !attachments.failed.is_empty() {
        let (name, why) = attachments
            .failed
            .iter()
            .next()
            .map(|(n, w)| (n.clone(), w.clone()))
            .unwrap_or_default();
        bail!("cannot attach the guard to {name}: {why}");
    }
    let announcer_names: Vec<&'static str> =
        cluster_announcers.iter().map(Announcer::name).collect();
    // Maps are sized at load; their memory is read once.
    let memlock = dp.memlock_bytes();
    let status_of = |dp: &Datapath,
                     att: &interfaces::Attachments,
                     view: &View,
                     cluster: Option<&ClusterView>| status::Status {
        node: node.clone(),
        mode: mode.as_str(),
        interfaces: status::Interface::of(att),
        lb_ips: status::Counts::of(view),
        not_enforced: dp.not_enforced,
        map_memory_bytes: memlock,
        feed: cluster.map(|c| status::Feed::of(announcer_names.clone(), c)),
    };
    // The API: bound now, so that a taken port fails the start, not later.
    let shared = Arc::new(api::Shared {
        state: Default::default(),
        heartbeat_ns: std::sync::atomic::AtomicU64::new(datapath::monotonic_ns()),
        maps: dp
            .counter_maps()
            .map_err(
                |e| tracing::warn!(error = %format!("{e:#}"), "counters unavailable to the API"),
            )
            .ok(),
        events: tokio::sync::broadcast::channel(1024).0,
        metrics_max_ip_series: args.metrics_max_ip_series,
        fold: Default::default(),
    });
    match dp.take_events() {
        Ok(ring) => {
            tokio::spawn(crate::events::run(ring, shared.clone()));
        }
        Err(e) => tracing::warn!(error = %format!("{e:#}"), "drop events unavailable"),
    }
    if let Some(listener) = listener {
        let s = shared.clone();
        tokio::spawn(api::serve(listener, s));
    }
    // The daemon's state, built once per change, for the API and the status file.
    let mut last_status = None;
    let mut publish = |dp: &Datapath,
                       att: &interfaces::Attachments,
                       view: &View,
                       cluster: Option<&ClusterView>,
                       view_changed: bool| {
        let status = status_of(dp, att, view, cluster);
        if let Some(path) = &args.status_file {
            status::publish(path, &status, &mut last_status);
        }
        let mut not_ready = Vec::new();
        for p in &att.missing {
            not_ready.push(format!("no interface matches --interface {p}"));
        }
        for (i, why) in &att.failed {
            not_ready.push(format!("attach to {i} failed: {why}"));
        }
        if att.attached.is_empty() {
            not_ready.push("attached to no interface".into());
        }
        if cluster.is_some_and(|c| !c.synced) {
            not_ready.push("Kubernetes feed not synced yet".into());
        }
        let ifnames: std::collections::BTreeMap<u32, String> = att
            .attached
            .iter()
            .map(|(n, (i, _))| (*i, n.clone()))
            .collect();
        let mut st = shared.write();
        if view_changed || st.ips.is_empty() {
            st.ips = api::ip_entries(&st.ips, view, &ifnames);
        }
        st.interfaces = att
            .attached
            .iter()
            .map(|(n, (i, _))| (n.clone(), view.if_primary.contains_key(i)))
            .collect();
        st.status = Some(status);
        st.not_ready = not_ready;
        st.mode = Some(mode);
        st.leak_action = Some(leak_action);
        st.feed_enabled = cluster.is_some();
        st.feed_failing_since = cluster.and_then(|c| c.failing_since);
    };
    publish(
        &dp,
        &attachments,
        &view,
        cluster_on.then(|| cluster_rx.borrow().clone()).as_ref(),
        true,
    );
    tracing::info!(
        node = %node,
        mode = mode.as_str(),
        leak_action = leak_action.as_str(),
        lb_ips = view.lb.len(),
        owned = view.count(Ownership::Owned),
        foreign = view.count(Ownership::Foreign),
        unknown = view.count(Ownership::Unknown),
        "arp-guard is enforcing"
    );

    let (addr_tx, mut addr_rx) = watch::channel(table);
    tokio::spawn(addrs::watch(nl, notifications, addr_tx, args.resync));
    let (file_tx, mut file_rx) = watch::channel(file_now.clone().unwrap_or_default());
    // Without a file the sender stays here, so `changed()` simply never fires.
    let _idle_file_tx = match (args.ownership_file.clone(), file) {
        (Some(path), Some((_, text))) => {
            tokio::spawn(file_source::watch(
                path,
                text,
                file_tx,
                args.file_poll,
                args.ownership_file_max_bytes,
            ));
            None
        }
        _ => Some(file_tx),
    };

    let mut stats_tick = tokio::time::interval(if args.stats_interval.is_zero() {
        std::time::Duration::from_secs(3600 * 24 * 365)
    } else {
        args.stats_interval
    });
    stats_tick.tick().await;
    // Heartbeats (and program log forwarding, and retries of failed writes).
    let mut log_tick = tokio::time::interval(std::time::Duration::from_millis(500));
    let mut reconcile_tick =
        tokio::time::interval(args.resync.max(std::time::Duration::from_secs(1)));
    reconcile_tick.tick().await;
    // Counter rows of IPs that left are looked at often enough to go soon
    // after their grace period, and no more often than needed.
    let mut reclaim_tick = tokio::time::interval((args.counter_grace / 2).clamp(
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(30),
    ));
    reclaim_tick.tick().await;
    let reclaimer = dp
        .counter_reclaimer()
        .map_err(|e| tracing::warn!(error = %format!("{e:#}"), "counter rows cannot be reclaimed"))
        .ok()
        .map(|r| std::sync::Arc::new(tokio::sync::Mutex::new(r)));
    let mut current = view;
    let mut pins_ok = true;
    let mut node_warned = false;
    let signal_name = loop {
        tokio::select! {
            _ = sigterm.recv() => break "SIGTERM",
            _ = sigint.recv() => break "SIGINT",
            // A source whose task ended would leave its last view in force
            // for good: exit instead, so that the supervisor restarts us.
            r = addr_rx.changed() => r.context("the interface watcher stopped")?,
            r = file_rx.changed() => r.context("the ownership file watcher stopped")?,
            r = cluster_rx.changed() => r.context("the Kubernetes feed stopped")?,
            _ = stats_tick.tick() => {
                log_counters(&dp, "counters");
                continue;
            }
            _ = reconcile_tick.tick() => {
                if let Some(dir) = args.pin_dir.as_deref() {
                    if !pins::intact(dir) {
                        if pins_ok {
                            tracing::warn!(pin_dir = %dir.display(), "the pins are gone (bpffs unmounted?); the guard keeps enforcing, re-pinning");
                        }
                        pins_ok = match dp.repin() {
                            Ok(()) => {
                                tracing::info!(pin_dir = %dir.display(), "maps and program pinned again");
                                true
                            }
                            Err(e) => {
                                if pins_ok {
                                    tracing::warn!(error = %format!("{e:#}"), "cannot pin again; a restart will not be seamless until bpffs is back");
                                }
                                false
                            }
                        };
                    }
                }
                // Full reconcile: compare with what the kernel really holds.
                let additive = cluster_on && !cluster_rx.borrow().synced;
                match dp.reload_from_kernel() {
                    Ok(0) if dp.not_enforced == 0 => {}
                    // Entries that met a full map get another try.
                    Ok(0) => dirty = !report_apply(&mut dp, &current, additive),
                    Ok(n) => {
                        tracing::warn!(entries = n, "BPF maps drifted from the view (changed outside arp-guard); repairing");
                        dirty = !report_apply(&mut dp, &current, additive);
                    }
                    Err(e) => tracing::warn!(error = %format!("{e:#}"), "cannot re-read the BPF maps"),
                }
                continue;
            }
            _ = reclaim_tick.tick() => {
                // Off the main loop: it walks the whole counter map. One run
                // at a time.
                if let (Some(r), lb) = (reclaimer.as_ref(), dp.lb_set()) {
                    if let Ok(mut r) = r.clone().try_lock_owned() {
                        let grace = args.counter_grace;
                        tokio::task::spawn_blocking(move || {
                            match r.reclaim(&lb, std::time::Instant::now(), grace) {
                                Ok(0) => {}
                                Ok(n) => tracing::debug!(rows = n, "counter rows of LB IPs gone for --counter-grace removed"),
                                Err(e) => tracing::warn!(error = %format!("{e:#}"), "cannot reclaim counter rows"),
                            }
                        });
                    }
                }
                continue;
            }
            _ = sighup.recv() => {
                tracing::info!("SIGHUP: re-reading the maps and re-applying the view");
                reconcile_tick.reset_immediately();
                continue;
            }
            _ = log_tick.tick() => {
                match dp.heartbeat() {
                    Ok(()) => shared.heartbeat_ns.store(datapath::monotonic_ns(), std::sync::atomic::Ordering::Relaxed),
                    Err(e) => {
                        api::OPS.error("heartbeat");
                        tracing::warn!(error = %format!("{e:#}"), "cannot write the heartbeat");
                    }
                }
                dp.flush_program_logs();
                // A write that failed (e.g. a full map) is retried until it lands.
                if dirty {
                    let additive = cluster_on && !cluster_rx.borrow().synced;
                    dirty = !report_apply(&mut dp, &current, additive);
                }
                continue;
            }
        }
        let file = args
            .ownership_file
            .is_some()
            .then(|| file_rx.borrow_and_update().clone());
        let table = addr_rx.borrow_and_update().clone();
        let cluster = cluster_on.then(|| cluster_rx.borrow_and_update().clone());
        if let Some(c) = &cluster {
            if c.synced && !c.holders.is_empty() && !c.holders.contains(&node) && !node_warned {
                node_warned = true;
                tracing::warn!(
                    node = %node,
                    holders = ?c.holders,
                    "this node's name matches none of the lease holders and announcing nodes seen: \
                     a likely --node-name / NODE_NAME misconfiguration (or this node announces nothing yet)"
                );
            }
        }
        let mut next = derive(&node, &args, file.as_ref(), &table, cluster.as_ref());
        if cluster.as_ref().is_some_and(|c| !c.synced) {
            next.hold_previous(|ip| dp.map_state(ip));
        }
        let view_changed = next != current;
        if view_changed {
            log_changes(&current, &next);
            let unsynced = cluster.as_ref().is_some_and(|c| !c.synced);
            dirty = !report_apply(&mut dp, &next, unsynced);
            current = next;
            // How long a cluster event took to reach the maps (BENCHMARKS.md).
            if let Some(at) = cluster.as_ref().and_then(|c| c.event_at) {
                tracing::debug!(
                    feed_to_map_us = at.elapsed().as_micros() as u64,
                    "cluster change applied"
                );
            }
        }
        // Interfaces that appeared, vanished or were renamed (after the maps
        // know their addresses).
        if table.links != links_seen {
            attachments.sync(&mut dp, &table);
            links_seen = table.links.clone();
        }
        publish(&dp, &attachments, &current, cluster.as_ref(), view_changed);
    };
    tracing::info!(signal = signal_name, "shutting down");
    log_counters(&dp, "final counters");
    if args.on_exit == OnExit::Keep {
        for (iface, r) in dp.keep_all() {
            match r {
                Ok(()) => {
                    tracing::info!(interface = %iface, "guard left attached for the next daemon (--on-exit keep)")
                }
                Err(e) => {
                    tracing::error!(interface = %iface, error = %format!("{e:#}"), "cannot leave the guard attached")
                }
            }
        }
        return Ok(());
    }
    for (iface, r) in dp.detach_all() {
        match r {
            Ok(()) => tracing::info!(interface = %iface, "guard detached"),
            Err(e) => {
                tracing::error!(interface = %iface, error = %format!("{e:#}"), "detach failed")
            }
        }
    }
    Ok(())
}

fn derive(
    node: &str,
    args: &RunArgs,
    file: Option<&OwnershipFile>,
    table: &AddrTable,
    cluster: Option<&ClusterView>,
) -> View {
    let guarded: Vec<String> = interfaces::wanted(&args.interfaces, &args.lb_ips_from, table)
        .into_keys()
        .collect();
    view::compute(&view::Inputs {
        node,
        file,
        lb_ips_from: &args.lb_ips_from,
        guarded: &guarded,
        addrs: table,
        cluster,
    })
}

/// Apply `view`; false if some entry could not be written (it will be
/// retried every second). Entries that did not fit in a full map are
/// reported, and retried on the next change or reconcile.
fn report_apply(dp: &mut Datapath, view: &View, additive: bool) -> bool {
    let r = dp.apply(view, additive);
    if !r.full.is_empty() {
        let shown: Vec<&str> = r.full.iter().take(10).map(String::as_str).collect();
        tracing::warn!(
            count = r.full.len(),
            first = ?shown,
            "map full: these entries are not in the kernel; an LB IP that did not fit is not guarded (its frames pass)"
        );
    }
    dp.not_enforced = r.full.len();
    let ops = &*api::OPS;
    ops.map_writes
        .fetch_add(r.written as u64, std::sync::atomic::Ordering::Relaxed);
    ops.map_removes
        .fetch_add(r.removed as u64, std::sync::atomic::Ordering::Relaxed);
    if !r.full.is_empty() {
        ops.error("map_full");
    }
    for e in &r.errors {
        ops.error("map_write");
        tracing::error!(error = %e, "map update failed; that entry keeps its previous value");
    }
    if view.ignored_v6 > 0 {
        tracing::debug!(
            count = view.ignored_v6,
            "IPv6 LB IPs are known but not enforced (ARP is IPv4 only)"
        );
    }
    tracing::debug!(written = r.written, removed = r.removed, "maps updated");
    r.errors.is_empty()
}

fn log_changes(old: &View, new: &View) {
    for (ip, l) in &new.lb {
        match old.lb.get(ip) {
            Some(o) if o.state == l.state => {}
            Some(o) => {
                tracing::info!(lb_ip = %ip, from = o.state.as_str(), to = l.state.as_str(), source = %l.source, "ownership changed")
            }
            None => {
                tracing::info!(lb_ip = %ip, state = l.state.as_str(), source = %l.source, "LB IP added")
            }
        }
    }
    for ip in old.lb.keys().filter(|ip| !new.lb.contains_key(ip)) {
        tracing::info!(lb_ip = %ip, "LB IP removed");
    }
}

fn log_counters(dp: &Datapath, what: &str) {
    match dp.snapshot() {
        Ok(s) => tracing::info!(counters = %s.summary(), "{what}"),
        Err(e) => tracing::warn!(error = %format!("{e:#}"), "cannot read counters"),
    }
}

/// A node name that matches no owner in the file is most likely a typo.
fn warn_if_node_unknown(node: &str, file: Option<&OwnershipFile>) {
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
