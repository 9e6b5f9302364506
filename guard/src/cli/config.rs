//! The command line turned once into one typed config per part (datapath,
//! sources, API, daemon), checked: no part sees `RunArgs`.

use std::time::Duration;

use anyhow::{bail, Result};

use super::{AnnouncerArg, AttachArg, KubeVipElection, OnExit, RunArgs};
use crate::{
    daemon::{
        ApiConfig, ClientsConfig, DaemonConfig, KubeEventsConfig, RunConfig, SourcesConfig,
        TakeoverConfig,
    },
    datapath::{AttachMode, DatapathConfig, Gate},
    sources::{
        cluster::{objects::ServiceFilter, Announcer, ClusterConfig, FeedConfig, Key},
        file_watch::FileConfig,
        presence::PresenceConfig,
    },
};

impl RunArgs {
    /// The command line as one typed config per part, checked: flag
    /// combinations that cannot do what the user means are errors here.
    pub fn config(&self) -> Result<RunConfig> {
        self.check()?;
        Ok(RunConfig {
            daemon: self.daemon(),
            datapath: self.datapath()?,
            sources: self.sources(),
            presence: self.presence(),
            node_report: (self.sources().cluster.is_some())
                .then_some(self.presence.node_report_interval)
                .filter(|i| !i.is_zero()),
            api: ApiConfig {
                listen: self.listen.addr(),
                metrics_listen: self.metrics_listen.addr(),
                metrics_max_ip_series: self.metrics_max_ip_series,
            },
            clients: ClientsConfig {
                stale_after: self.stale_client_after,
                read_period: self.clients_read_period,
                refresh_per_minute: self.refresh(),
            },
            kube_events: KubeEventsConfig {
                // Two reads of the records after the answering node's next
                // renewal, and a second to spare.
                review: self
                    .presence()
                    .map_or(Duration::ZERO, |p| p.period * 2 + Duration::from_secs(1)),
                ..self.kube_events.config()
            },
            probing: self.probing(),
        })
    }

    /// The active census: in enforce mode, or in monitor mode when asked
    /// for (`--probe-in-monitor-mode`). Monitor mode is the trial that
    /// changes nothing: nothing of the guard's own goes on the wire.
    fn probing(&self) -> Option<crate::model::probing::Pace> {
        let pace = self.presence.probing.pace()?;
        let monitor = self.mode != super::ModeArg::Enforce;
        if monitor && !self.presence.probing.probe_in_monitor_mode {
            tracing::info!(
                "the active census does not run in monitor mode (nothing is sent); \
                 --probe-in-monitor-mode turns it on"
            );
            return None;
        }
        Some(pace)
    }

    /// Spellings still accepted that have a better one now, each with what
    /// to write instead (logged at start).
    pub fn deprecations(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.announcers.contains(&AnnouncerArg::File) {
            out.push(
                "--announcer file is deprecated: the ownership file is read whenever \
                 --ownership-file is given; drop --announcer file"
                    .to_owned(),
            );
        }
        out
    }

    /// Flag combinations that cannot do what the user means.
    fn check(&self) -> Result<()> {
        if self.on_exit == OnExit::Keep && self.pin_dir.is_none() {
            bail!(
                "--on-exit keep needs --pin-dir: without pins the guard cannot outlive the daemon"
            );
        }
        let mut seen = std::collections::BTreeSet::new();
        for i in &self.uplinks {
            if !seen.insert(i) {
                bail!("--interface {i} is given twice");
            }
        }
        if self.announcers.contains(&AnnouncerArg::File) && self.ownership_file.is_none() {
            bail!("--announcer file needs --ownership-file PATH");
        }
        let announcers = self.cluster_announcers();
        if self.ownership_file.is_none() && self.lb_ifaces.is_empty() && announcers.is_empty() {
            bail!(
                "nothing to enforce: give --announcer cilium|kube-vip|metallb, --ownership-file, and/or --lb-ips-from \
                 (e.g. --lb-ips-from kube-ipvs0)"
            );
        }
        if self.stale_client_after.is_zero() || self.clients_read_period.is_zero() {
            bail!("--stale-client-after and --clients-read-period must be longer than 0");
        }
        for i in &self.lb_ifaces {
            if self.uplinks.contains(i) {
                bail!(
                    "--lb-ips-from {i} conflicts with --interface {i}: the LB IPs' own interface is not the one \
                     that answers the segment; guard the uplink and read LB IPs from kube-ipvs0"
                );
            }
        }
        Ok(())
    }

    fn sources(&self) -> SourcesConfig {
        let announcers = self.cluster_announcers();
        let cluster = (!announcers.is_empty()).then(|| ClusterConfig {
            kubeconfig: self.kubeconfig.clone(),
            feed: FeedConfig {
                announcers,
                filter: ServiceFilter {
                    lb_class: self.lb_class.clone(),
                    external_ips: self.external_ips,
                },
                selector: self.service_selector.clone(),
                stale_after: self.stale_after,
                watch_timeout: self.kube_watch_timeout,
                settle_shared: self.settle_shared_ips,
            },
        });
        SourcesConfig {
            file: self.ownership_file.clone().map(|path| FileConfig {
                path,
                poll: self.file_poll,
                max_bytes: self.ownership_file_max_bytes,
            }),
            lb_ifaces: self.lb_ifaces.clone(),
            cluster,
            resync: self.resync,
        }
    }

    /// Presence: on with a period and the Kubernetes API to write to.
    fn presence(&self) -> Option<PresenceConfig> {
        let p = &self.presence;
        if p.presence_period.is_zero() || self.cluster_announcers().is_empty() {
            return None;
        }
        Some(PresenceConfig {
            kubeconfig: self.kubeconfig.clone(),
            namespace: p.presence_namespace.clone().filter(|n| !n.is_empty()),
            node: String::new(),
            period: p.presence_period,
            pods: p.presence_pods.clone(),
            watch_min: self.kube_watch_timeout,
        })
    }

    /// `--refresh-stale-clients` takes effect in enforce mode only: a guard
    /// in monitor mode sends nothing of its own.
    fn refresh(&self) -> Option<u32> {
        if !self.refresh_stale_clients {
            return None;
        }
        if self.mode != super::ModeArg::Enforce {
            tracing::warn!("--refresh-stale-clients is ignored in monitor mode (it sends nothing)");
            return None;
        }
        Some(self.refresh_per_minute)
    }

    fn daemon(&self) -> DaemonConfig {
        DaemonConfig {
            node_name: self.node_name.clone(),
            uplinks: self.uplinks.clone(),
            on_exit: self.on_exit,
            status_file: self.status_file.clone(),
            stats_interval: self.stats_interval,
            counter_grace: self.counter_grace,
            takeover: TakeoverConfig {
                hold: if self.mode == super::ModeArg::Enforce {
                    self.announce_hold
                } else {
                    Duration::ZERO
                },
                silent_after: self.silent_takeover_after,
                window: self.announce_hold,
                verdict: self.kube_events.split_brain_after,
            },
            cgroup_root: self.cgroup_root.clone(),
        }
    }

    fn datapath(&self) -> Result<DatapathConfig> {
        let gate = Gate {
            stale_after: self
                .heartbeat_stale_after
                .or(self.stale_after)
                .unwrap_or(Duration::from_secs(15)),
            dead_after: self.heartbeat_dead_after,
        };
        if gate.dead_after <= gate.stale_after {
            bail!(
                "--heartbeat-dead-after ({:?}) must be longer than the stale threshold ({:?})",
                gate.dead_after,
                gate.stale_after
            );
        }
        Ok(DatapathConfig {
            mode: self.mode.into(),
            leak_action: self.leak_action.into(),
            max_lb_ips: self.max_lb_ips,
            pin_dir: self.pin_dir.clone(),
            attach: self.attach.into(),
            gate,
            event_rate: self.event_rate,
            event_burst: self.event_burst,
            census: !self.no_census,
            census_window: self.census_window,
            // Monitor mode drops nothing, so holds nothing.
            defer: !self.announce_hold.is_zero() && self.mode == super::ModeArg::Enforce,
        })
    }

    /// The announcers that read the Kubernetes API, in the order given.
    fn cluster_announcers(&self) -> Vec<Announcer> {
        let mut out = Vec::new();
        for a in &self.announcers {
            let a = match a {
                // The file is its own source (--ownership-file), not an API reader.
                AnnouncerArg::File => continue,
                AnnouncerArg::Cilium => Announcer::Cilium {
                    namespace: self.cilium_namespace.clone(),
                },
                AnnouncerArg::KubeVip => match self.kube_vip_election {
                    KubeVipElection::PerService => Announcer::KubeVipPerService,
                    KubeVipElection::Global => Announcer::KubeVipGlobal {
                        lease: Key::new(
                            self.kube_vip_namespace.clone(),
                            self.kube_vip_lease.clone(),
                        ),
                    },
                },
                AnnouncerArg::Metallb => Announcer::MetalLb {
                    namespace: self.metallb_namespace.clone(),
                },
            };
            if !out.contains(&a) {
                out.push(a);
            }
        }
        out
    }
}

impl From<AttachArg> for AttachMode {
    fn from(a: AttachArg) -> Self {
        match a {
            AttachArg::Auto => AttachMode::Auto,
            AttachArg::Tcx => AttachMode::Tcx,
            AttachArg::Netlink => AttachMode::Netlink,
        }
    }
}
