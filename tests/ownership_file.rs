//! The ownership file over time: reloads (valid, invalid, atomic replace),
//! hostile files refused without blocking, no gap while a reload applies,
//! SIGHUP, and the daemon's own reads not waking another reload.

use std::time::Duration;

use testbed::{
    bed::{Bed, FOREIGN, NODE, OTHER, OWNED},
    wait_until, ArpSpec, Daemon, RawSocket,
};

fn owners_with(foreign_owner: &str) -> String {
    format!(
        "ips:\n  - ip: {OWNED}\n    owner: {NODE}\n  - ip: {FOREIGN}\n    owner: {foreign_owner}\n"
    )
}

#[test]
fn ownership_file_reload_valid_and_invalid() {
    testbed::require_root();
    let bed = Bed::new("reload").unwrap();
    let guard = bed.start(&[]).unwrap();
    let f = FOREIGN.to_string();
    assert_eq!(
        bed.resolve(&f),
        None,
        "foreign at start: the node must not answer"
    );

    // Atomic replace (write + rename), as ConfigMap updates and editors do.
    bed.replace_owners(&owners_with(NODE)).unwrap();
    guard.expect_log("ownership file reloaded", Duration::from_secs(5));
    assert_eq!(
        bed.resolve(&f),
        Some(bed.node_mac),
        "now owned: the node answers"
    );

    // An invalid update: rejected with file, line and field; the last good
    // state (owned) stays in force. Replaced whole, so that the daemon
    // sees one bad content (written in place, the watcher may also read it
    // half written: rightly rejected, but a second error).
    bed.replace_owners("ips:\n  - ip: 198.51.100.101\n    owner: node-a\n  - ip: 198.51.100.300\n    owner: node-b\n").unwrap();
    let line = guard.expect_log("ownership file rejected", Duration::from_secs(30));
    assert!(
        line.contains("owners.yaml:4"),
        "names file and line: {line}"
    );
    assert!(line.contains("ips[1].ip"), "names the field: {line}");
    assert_eq!(
        bed.resolve(&f),
        Some(bed.node_mac),
        "the last good state stays in force"
    );
    assert_eq!(
        guard.count_log("ownership file rejected"),
        1,
        "one error per bad content, not one per poll"
    );

    // A truncated file (cut mid-write into invalid YAML) is rejected too.
    bed.replace_owners("ips:\n  - ip: 198.51.100.101\n    owner: [node-a\n")
        .unwrap();
    assert!(wait_until(Duration::from_secs(30), || guard
        .count_log("ownership file rejected")
        == 2));
    assert_eq!(bed.resolve(&f), Some(bed.node_mac));

    // A file that disappears keeps the state as well.
    std::fs::remove_file(&bed.owners).unwrap();
    guard.expect_log("ownership file unreadable", Duration::from_secs(5));
    assert_eq!(bed.resolve(&f), Some(bed.node_mac));

    // Valid again, owned by the other node: protection is back.
    std::fs::write(&bed.owners, owners_with(OTHER)).unwrap();
    assert!(wait_until(Duration::from_secs(5), || guard
        .count_log("ownership file reloaded")
        == 2));
    assert_eq!(bed.resolve(&f), None, "foreign again: dropped");
    assert!(
        guard.count_log("ownership changed") >= 2,
        "state changes are logged"
    );
}

/// What a careless operator or an attacker can put at the file's path: a
/// FIFO nobody writes (a plain read would block forever), a symlink to
/// /dev/zero (a plain read would grow without end), a file over the limit.
/// Each is refused at once, logged once with the path, the last good state
/// stays, later valid edits are applied, and SIGTERM still ends the daemon.
#[test]
fn hostile_ownership_files_are_refused_without_blocking() {
    testbed::require_root();
    let bed = Bed::new("hostile").unwrap();
    let mut guard = bed.start(&["--ownership-file-max-bytes", "4096"]).unwrap();
    let f = FOREIGN.to_string();
    assert_eq!(bed.resolve(&f), None, "foreign at start");
    let problems = [
        ("FIFO", "is a FIFO"),
        ("/dev/zero", "is a character device"),
        ("too big", "more than the limit of 4096"),
    ];
    for (i, (what, message)) in problems.iter().enumerate() {
        // Made beside it and renamed over it: a poll never finds the file
        // missing in between (that would be a problem of its own).
        let next = bed.owners.with_extension("next");
        match *what {
            "FIFO" => testbed::mkfifo(&next),
            "/dev/zero" => std::os::unix::fs::symlink("/dev/zero", &next).unwrap(),
            _ => std::fs::write(
                &next,
                format!("# {}\n{}", "x".repeat(8192), owners_with(NODE)),
            )
            .unwrap(),
        }
        std::fs::rename(&next, &bed.owners).unwrap();
        let line = guard
            .wait_log(message, Duration::from_secs(5))
            .unwrap_or_else(|| panic!("{what}: {}", guard.log_text()));
        assert!(
            line.contains("owners.yaml"),
            "{what}: names the path: {line}"
        );
        // Many polls later (every 200 ms): still one line per problem.
        std::thread::sleep(Duration::from_secs(1));
        assert_eq!(guard.count_log(message), 1, "{what}: logged once");
        assert_eq!(guard.count_log("ownership file unreadable"), i + 1);
        assert_eq!(bed.resolve(&f), None, "{what}: the last good state stays");
        assert!(guard.rss_kib() < 100 * 1024, "{what}: memory stays bounded");
    }
    // A valid edit after all that is applied.
    std::fs::remove_file(&bed.owners).unwrap();
    std::fs::write(&bed.owners, owners_with(NODE)).unwrap();
    guard.expect_log("ownership file reloaded", Duration::from_secs(5));
    assert_eq!(bed.resolve(&f), Some(bed.node_mac), "now owned");
    // And with a FIFO in place again, SIGTERM still ends the daemon promptly.
    std::fs::remove_file(&bed.owners).unwrap();
    testbed::mkfifo(&bed.owners);
    std::thread::sleep(Duration::from_millis(500));
    let status = guard.stop(libc::SIGTERM, Duration::from_secs(5)).unwrap();
    assert!(status.success(), "{status:?}");
}

/// Protection has no gap while the view changes: a speaker keeps announcing a
/// foreign IP while the ownership file is reloaded and kube-ipvs0 addresses
/// come and go; not one of its frames may reach the neighbour.
#[test]
fn reloads_open_no_gap() {
    testbed::require_root();
    let bed = Bed::new("nogap").unwrap();
    let guard = bed.start(&[]).unwrap();
    let cap = RawSocket::open(&bed.peer, "eth0").unwrap();
    let speaker = RawSocket::open(&bed.node, "eth0").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let frame = ArpSpec::gratuitous(2, bed.node_mac, FOREIGN).to_bytes();
    let sender = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sent = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                speaker.send(&frame).unwrap();
                sent += 1;
                std::thread::sleep(Duration::from_micros(500));
            }
            sent
        })
    };
    let extra = "198.51.100.150";
    for round in 0..6 {
        // Another IP changes owner in the file: a reload that rewrites the map.
        let owner = if round % 2 == 0 { NODE } else { OTHER };
        std::fs::write(
            &bed.owners,
            format!(
                "{}  - ip: {extra}\n    owner: {owner}\n",
                testbed::bed::default_owners()
            ),
        )
        .unwrap();
        let want = round + 1;
        assert!(
            wait_until(Duration::from_secs(5), || guard
                .count_log("ownership file reloaded")
                >= want),
            "reload {want} not seen:\n{}",
            guard.log_text()
        );
        // An address comes and goes on kube-ipvs0.
        let a = format!("198.51.100.{}/32", 160 + round);
        bed.node
            .ip(&["addr", "add", &a, "dev", "kube-ipvs0"])
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        bed.node
            .ip(&["addr", "del", &a, "dev", "kube-ipvs0"])
            .unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = sender.join().unwrap();
    let leaked: Vec<_> = cap
        .collect_arp(Duration::from_millis(300))
        .unwrap()
        .into_iter()
        .filter(|c| c.spa == FOREIGN)
        .collect();
    assert!(
        leaked.is_empty(),
        "{} of {sent} foreign announcements got through",
        leaked.len()
    );
    let dropped = bed
        .packets(FOREIGN, "gratuitous", "speaker", "dropped")
        .unwrap();
    assert_eq!(dropped, sent, "every frame sent was judged and dropped");
    assert!(
        sent > 1000,
        "the speaker kept sending during the reloads ({sent})"
    );
}

/// SIGHUP does not kill the daemon (its default action would): it re-applies.
#[test]
fn sighup_reapplies_and_keeps_running() {
    testbed::require_root();
    let bed = Bed::new("hup").unwrap();
    let mut guard = bed.start(&[]).unwrap();
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(guard.pid() as i32, libc::SIGHUP) };
    guard.expect_log("SIGHUP", Duration::from_secs(5));
    assert_eq!(bed.resolve(&FOREIGN.to_string()), None, "still guarding");
    let status = guard.stop(libc::SIGTERM, Duration::from_secs(10)).unwrap();
    assert!(status.success());
}

/// Opens of `path` during `d`, seen by an inotify watch of this process
/// (open and close events both: inotify merges identical successive
/// events, an open after a close is not one).
fn opens_during(path: &std::path::Path, d: Duration) -> usize {
    use std::os::unix::ffi::OsStrExt as _;
    let name = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let mask = libc::IN_OPEN | libc::IN_CLOSE_NOWRITE;
    // SAFETY: plain syscalls on a descriptor this function owns and closes;
    // the buffer outlives every read into it, and each event header read
    // from it lies within what the read returned.
    unsafe {
        let fd = libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC);
        assert!(fd >= 0);
        assert!(libc::inotify_add_watch(fd, name.as_ptr(), mask) >= 0);
        std::thread::sleep(d);
        let mut buf = [0u8; 65536];
        let mut opens = 0;
        loop {
            let got = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
            if got <= 0 {
                break;
            }
            let mut at = 0;
            while at + 16 <= got as usize {
                let ev: libc::inotify_event = std::ptr::read_unaligned(buf.as_ptr().add(at).cast());
                opens += usize::from(ev.mask & libc::IN_OPEN != 0);
                at += 16 + ev.len as usize;
            }
        }
        libc::close(fd);
        opens
    }
}

/// The daemon reads its ownership file when it changes and once per
/// `--file-poll`, not more: its own reads (inotify open events on the
/// directory it watches) do not wake another reload (they did, over and
/// over, keeping a daemon at rest busy).
#[test]
fn reading_the_ownership_file_does_not_wake_its_own_reload() {
    testbed::require_root();
    let bed = Bed::new("selfwake").unwrap();
    // The bed's usual arguments, polling once a minute instead of 5 a second.
    let args: Vec<String> = (bed.args(&[]).into_iter())
        .map(|a| if a == "200ms" { "60s".to_owned() } else { a })
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let guard = Daemon::start(&bed.node, &args).unwrap();
    // A change is seen at once (and its reload reads the file)...
    std::fs::write(&bed.owners, owners_with(NODE)).unwrap();
    guard.expect_log("ownership file reloaded", Duration::from_secs(5));
    // ...and then the file is left alone.
    std::thread::sleep(Duration::from_secs(1));
    let opens = opens_during(&bed.owners, Duration::from_secs(3));
    assert!(
        opens <= 1,
        "the file was opened {opens} times in 3 s at rest"
    );
}
