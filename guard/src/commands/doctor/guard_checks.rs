//! The guard itself: TCX support, bpffs, the daemon (API or pins),
//! whether it is attached on each uplink and where in the TC chain, its
//! mode, and the health of its Kubernetes feed.

use std::path::Path;

use super::{
    gathered::{list, Gathered, Plan},
    guard_view::{Attached, GuardView},
    node::kernel_version,
    report::{Check, CheckStatus},
};
use crate::{
    api::types::StatusDoc, datapath::inspect::is_guard_program, telemetry::status::InterfaceState,
};

/// `tcx`: whether the kernel has TCX (a TCX query answered, else the release).
pub fn tcx(f: &Gathered) -> Check {
    const C: &str = "tcx";
    let release = f
        .node
        .kernel
        .clone()
        .unwrap_or_else(|e| format!("unknown ({e})"));
    let queried = f.guard.chains.values().any(|c| c.tcx.is_ok());
    let version = f.node.kernel.as_deref().ok().and_then(kernel_version);
    let yes = "the guard attaches through TCX links, first in the chain, pinned so that a restart swaps the program in place";
    match version {
        _ if queried => Check::new(C, None, CheckStatus::Pass, format!("yes (Linux {release}; the kernel answered a TCX query)"), yes),
        Some(v) if v >= (6, 6) => Check::new(C, None, CheckStatus::Pass, format!("yes (Linux {release})"), yes),
        Some(v) if v >= (5, 10) => Check::new(
            C,
            None,
            CheckStatus::Pass,
            format!("no (Linux {release} < 6.6)"),
            "the guard attaches a netlink clsact filter in a fixed slot (priority 1), replaced in place on restart; a backport (RHEL 9) may have TCX anyway",
        ),
        Some(_) => Check::new(C, None, CheckStatus::Fail, format!("no (Linux {release})"), "arp-guard needs Linux 5.10 or later")
            .fix("upgrade the kernel"),
        None => Check::new(C, None, CheckStatus::Warn, format!("unknown (Linux {release})"), "cannot tell the kernel's release"),
    }
}

/// `bpffs`: a bpf file system where the pins go.
pub fn bpffs(f: &Gathered, plan: &Plan) -> Check {
    const C: &str = "bpffs";
    let mounts = match &f.node.bpf_mounts {
        Ok(m) => m,
        Err(e) => {
            return Check::new(
                C,
                None,
                CheckStatus::Warn,
                "unknown",
                format!("cannot read the mounts: {e}"),
            )
        }
    };
    let pin_dir = Path::new(&plan.pin_dir);
    if let Some(m) = mounts
        .iter()
        .filter(|m| pin_dir.starts_with(m))
        .max_by_key(|m| m.as_os_str().len())
    {
        return Check::new(
            C,
            None,
            CheckStatus::Pass,
            format!("mounted at {}", m.display()),
            format!("--pin-dir {} is on it: a restarted guard takes over its pinned maps and links without a gap", pin_dir.display()),
        );
    }
    let value = if mounts.is_empty() {
        "not mounted".to_owned()
    } else {
        format!(
            "mounted at {}, not under --pin-dir",
            list(&mounts.iter().map(|m| m.display()).collect::<Vec<_>>())
        )
    };
    Check::new(
        C,
        None,
        CheckStatus::Warn,
        value,
        format!("nothing holds {}: without pins, a restarted guard leaves the interface unguarded for its start-up time", pin_dir.display()),
    )
    .fix("mount -t bpf bpf /sys/fs/bpf (systemd does it; the guard mounts it itself when --pin-dir is under it)")
}

/// `guard` from the daemon's status document.
fn guard_from_api(g: &GuardView, doc: &StatusDoc) -> Check {
    const C: &str = "guard";
    let st = doc.status.as_ref();
    let c = st.map(|s| &s.lb_ips);
    let value = format!(
        "daemon on {}: node {}, {}, {} LB IPs{}",
        g.api,
        st.map_or("?", |s| s.node.as_str()),
        if doc.ready { "ready" } else { "NOT ready" },
        c.map_or(0, |c| c.total),
        c.map(|c| format!(
            " (owned {}, foreign {}, unknown {})",
            c.owned, c.foreign, c.unknown
        ))
        .unwrap_or_default()
    );
    if !doc.ready {
        return Check::new(
            C,
            None,
            CheckStatus::Fail,
            value,
            format!("not ready: {}", doc.not_ready.join("; ")),
        )
        .fix("arp-guard status and the daemon's log say why");
    }
    if let Some(n) = st.map(|s| s.not_enforced).filter(|n| *n > 0) {
        return Check::new(
            C,
            None,
            CheckStatus::Fail,
            value,
            format!("{n} map entries did not fit: those LB IPs are not guarded"),
        )
        .fix("raise --max-lb-ips");
    }
    Check::new(
        C,
        None,
        CheckStatus::Pass,
        value,
        "the guard answers on its API and is ready",
    )
}

/// `guard`: is a guard running here, and is it well.
pub fn guard(f: &Gathered) -> Check {
    const C: &str = "guard";
    let g = &f.guard;
    if let Some(doc) = &g.status {
        return guard_from_api(g, doc);
    }
    let tried = g.tried.join("; ");
    if let Some((age, stale, dead)) = g.heartbeat() {
        let value = format!(
            "pinned under {}, heartbeat {:.1}s old; API on {} not answering",
            g.pin_dir,
            age.as_secs_f64(),
            g.api
        );
        return if age < stale {
            Check::new(C, None, CheckStatus::Warn, value, format!("a guard is attached and its daemon is alive, but its API does not answer here ({tried})"))
                .fix("pass --api with the daemon's --listen address (its feed health is known only there)")
        } else if age < dead {
            Check::new(C, None, CheckStatus::Fail, value, format!("the daemon stopped writing heartbeats {}s ago: the guard judges foreign IPs as unknown", age.as_secs()))
                .fix("restart arp-guard (kubectl -n arp-guard rollout restart ds/arp-guard)")
        } else {
            Check::new(C, None, CheckStatus::Fail, value, "the guard left in the kernel has no live daemon: past --heartbeat-dead-after it passes everything")
                .fix("restart arp-guard, or remove it: arp-guard uninstall")
        };
    }
    if g.pinned.as_ref().is_some_and(|p| p.config.is_some()) {
        return Check::new(
            C,
            None,
            CheckStatus::Warn,
            format!("pinned under {}, no heartbeat yet", g.pin_dir),
            format!("the API does not answer ({tried})"),
        );
    }
    Check::new(
        C,
        None,
        CheckStatus::Warn,
        "no arp-guard seen",
        format!("tried: {tried}"),
    )
    .fix("if arp-guard runs here, pass its --listen address as --api and its --pin-dir")
}

/// `attached` on an uplink.
pub fn attached(f: &Gathered, uplink: &str) -> Check {
    const C: &str = "attached";
    let a = f.guard.attached(uplink, f.node.ifindex(uplink));
    match a {
        Attached::Daemon(InterfaceState::Attached, how) => Check::new(C, Some(uplink), CheckStatus::Pass, format!("yes ({how})"), format!("every frame leaving {uplink} passes the guard")),
        Attached::Daemon(state, detail) => Check::new(C, Some(uplink), CheckStatus::Fail, format!("{} ({detail})", state.as_str()), format!("the guard is configured for {uplink} but not attached: its frames go out unchecked"))
            .fix("see the daemon's log; arp-guard status"),
        Attached::PinnedLink => Check::new(C, Some(uplink), CheckStatus::Pass, format!("yes (TCX link pinned under {})", f.guard.pin_dir), format!("every frame leaving {uplink} passes the guard")),
        Attached::Kernel(how) => Check::new(C, Some(uplink), CheckStatus::Pass, format!("yes ({how}, found in the kernel)"), format!("every frame leaving {uplink} passes the guard")),
        Attached::No if !f.guard.seen() => Check::new(C, Some(uplink), CheckStatus::Skip, "no guard seen", "see the guard check"),
        Attached::No => Check::new(C, Some(uplink), CheckStatus::Fail, "no", format!("arp-guard runs, but not on {uplink}: ARP leaving it is not checked"))
            .fix(format!("add -i {uplink} to arp-guard run")),
    }
}

/// `tc_chain` on an uplink: where the guard runs among the TC programs.
pub fn tc_chain(f: &Gathered, uplink: &str) -> Check {
    const C: &str = "tc_chain";
    let how = match f.guard.attached(uplink, f.node.ifindex(uplink)) {
        Attached::Daemon(InterfaceState::Attached, how) => how,
        Attached::PinnedLink => "tcx".to_owned(),
        Attached::Kernel(how) => how.to_owned(),
        _ => {
            return Check::new(
                C,
                Some(uplink),
                CheckStatus::Skip,
                "not attached",
                "see the attached check",
            )
        }
    };
    let Some(chain) = f.guard.chains.get(uplink) else {
        return Check::new(
            C,
            Some(uplink),
            CheckStatus::Skip,
            "not looked at",
            "the TC programs of this interface were not listed",
        );
    };
    let tcx = match &chain.tcx {
        Ok(t) => t,
        Err(e) => {
            return Check::new(C, Some(uplink), CheckStatus::Skip, "unknown", e.clone())
                .fix("run doctor as root to see the TCX chain")
        }
    };
    let ahead_fix = "restart arp-guard (it attaches first), or make sure the programs before it return TCX_NEXT for ARP";
    if how == "tcx" {
        return match tcx.iter().position(|n| is_guard_program(n)) {
            Some(0) => Check::new(C, Some(uplink), CheckStatus::Pass, format!("first of {} TCX program(s)", tcx.len()), "the guard sees every frame before any other egress program can end the chain"),
            Some(i) => Check::new(
                C,
                Some(uplink),
                CheckStatus::Warn,
                format!("{} of {} TCX programs, after {}", i + 1, tcx.len(), list(&tcx[..i])),
                "a program before it that returns TCX_PASS (Cilium's do) or redirects ends the chain: the guard never sees those frames",
            )
            .fix(ahead_fix),
            None => Check::new(C, Some(uplink), CheckStatus::Warn, format!("not among {} TCX program(s)", tcx.len()), "the daemon reports a TCX attachment the kernel does not list here (another network namespace?)"),
        };
    }
    let before_nl: Vec<String> = match &chain.netlink {
        Ok(fs) => fs
            .iter()
            .take_while(|x| !x.is_guard())
            .map(|x| format!("{} (pref {})", x.program, x.priority))
            .collect(),
        Err(e) => return Check::new(C, Some(uplink), CheckStatus::Skip, "unknown", e.clone()),
    };
    if tcx.is_empty() && before_nl.is_empty() {
        return Check::new(
            C,
            Some(uplink),
            CheckStatus::Pass,
            "netlink filter, first (no TCX programs)",
            "the guard sees every frame before any other egress program",
        );
    }
    let mut ahead: Vec<String> = tcx.iter().map(|n| format!("{n} (tcx)")).collect();
    ahead.extend(before_nl);
    Check::new(
        C,
        Some(uplink),
        CheckStatus::Warn,
        format!("netlink filter after {}", list(&ahead)),
        "TCX programs run before every netlink filter; one that returns TCX_PASS ends the chain before the guard",
    )
    .fix(ahead_fix)
}

/// `mode`: enforce or monitor.
pub fn mode(f: &Gathered) -> Check {
    const C: &str = "mode";
    match f.guard.mode().as_deref() {
        Some("enforce") => Check::new(
            C,
            None,
            CheckStatus::Pass,
            "enforce",
            "foreign replies are dropped and announce leaks rewritten",
        ),
        Some(m) => Check::new(
            C,
            None,
            CheckStatus::Warn,
            m.to_owned(),
            "monitor only counts what enforce would stop: nothing changes on the wire",
        )
        .fix("once the counters look right: --mode enforce (deploy/components/enforce)"),
        None => Check::new(C, None, CheckStatus::Skip, "unknown", "no guard seen"),
    }
}

/// `feed`: the Kubernetes ownership feed, as the daemon reports it.
pub fn feed(f: &Gathered) -> Check {
    const C: &str = "feed";
    let Some(doc) = &f.guard.status else {
        let why = if f.guard.seen() {
            "the feed's health is known only to the daemon's API, which does not answer"
        } else {
            "no guard seen"
        };
        return Check::new(C, None, CheckStatus::Skip, "unknown", why);
    };
    let Some(feed) = doc.status.as_ref().and_then(|s| s.feed.as_ref()) else {
        return Check::new(C, None, CheckStatus::Pass, "none", "no announcer reads the API: owners come from the ownership file and/or interface addresses");
    };
    let failing: Vec<&str> = feed
        .streams
        .iter()
        .filter(|s| !s.healthy)
        .map(|s| s.name.as_str())
        .collect();
    let value = format!(
        "{}: {}, {} of {} streams healthy{}",
        feed.announcers.join(","),
        if feed.synced { "synced" } else { "not synced" },
        feed.streams.len() - failing.len(),
        feed.streams.len(),
        if feed.degraded {
            ", degraded"
        } else if feed.blind {
            ", blind"
        } else {
            ""
        }
    );
    if let Some(p) = &feed.problem {
        return Check::new(
            C,
            None,
            CheckStatus::Fail,
            value,
            format!("the guard cannot read the API: {p}"),
        )
        .fix("fix the guard's credentials or RBAC as the problem says");
    }
    if feed.degraded {
        return Check::new(C, None, CheckStatus::Warn, value, format!("blind for longer than {}s: foreign IPs are judged unknown (speakers pass, kernel replies still drop)", feed.threshold_seconds))
            .fix("check the API server and the guard's log (failing streams: see arp-guard status)");
    }
    if !feed.synced || feed.blind {
        return Check::new(
            C,
            None,
            CheckStatus::Warn,
            value,
            format!("owners may be out of date (failing: {})", list(&failing)),
        )
        .fix("check the API server and the guard's log");
    }
    Check::new(
        C,
        None,
        CheckStatus::Pass,
        value,
        "the guard follows the announcers' records live",
    )
}
