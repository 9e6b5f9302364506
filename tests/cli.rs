//! Start-up errors read as causes: they name the interface, file, line,
//! field or flag at fault, and the daemon exits non-zero without attaching.

use std::time::Duration;

use testbed::{bed::Bed, guard_binary, Daemon, Netns};

/// Run `arp-guard run <args>` in `ns`; it must fail. Returns its log.
fn fails(ns: &Netns, args: &[&str]) -> String {
    let mut d = Daemon::spawn(ns, args).unwrap();
    // A deadline for "it exits", not a bound on how fast: the 6.1 lane,
    // emulated beside the host's tests, has taken more than 10 s.
    let status = d.wait_exit(Duration::from_secs(120)).unwrap();
    assert!(!status.success(), "arp-guard run {args:?} should fail");
    d.log_text()
}

#[test]
fn help_reads_well() {
    let out = std::process::Command::new(guard_binary())
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for word in ["run", "counters", "validate", "LoadBalancer"] {
        assert!(text.contains(word), "--help lacks {word}:\n{text}");
    }
    let out = std::process::Command::new(guard_binary())
        .args(["run", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--interface",
        "--node-name",
        "--ownership-file",
        "--lb-ips-from",
        "--mode",
        "--leak-action",
        "--attach",
        "NODE_NAME",
    ] {
        assert!(text.contains(flag), "run --help lacks {flag}:\n{text}");
    }
}

#[test]
fn startup_errors_name_the_culprit() {
    testbed::require_root();
    let bed = Bed::new("cli").unwrap();
    let ns = &bed.node;

    // A FIFO in place of the file: refused at once, not waited on.
    let fifo = bed.dir.path().join("fifo.yaml");
    testbed::mkfifo(&fifo);
    let bad = bed.dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "ips:\n  - ip: 198.51.100.10\n    owner: node-a\n    colour: blue\n",
    )
    .unwrap();
    let file = |path: &std::path::Path| {
        let path = path.to_str().unwrap().to_string();
        ["--ownership-file", &path, "--node-name", "node-a"].map(String::from)
    };
    let cases: Vec<(Vec<String>, &[&str])> = vec![
        (words("--node-name node-a"), &["nothing to enforce"]),
        (
            words("--announcer file --lb-ips-from kube-ipvs0"),
            &[
                "--announcer file is deprecated",
                "--announcer file needs --ownership-file",
            ],
        ),
        (
            words("-i eth0 --lb-ips-from kube-ipvs0"),
            &["--interface eth0 is given twice"],
        ),
        (
            words("--lb-ips-from eth0"),
            &["conflicts with --interface eth0"],
        ),
        (
            file("/nonexistent/owners.yaml".as_ref()).to_vec(),
            &[
                "cannot read the ownership file",
                "/nonexistent/owners.yaml: cannot read",
            ],
        ),
        (file(&fifo).to_vec(), &["fifo.yaml: is a FIFO"]),
        (file(&bad).to_vec(), &["bad.yaml:4", "colour"]),
    ];
    for (args, expected) in cases {
        let mut argv = vec!["-i", "eth0"];
        argv.extend(args.iter().map(String::as_str));
        let log = fails(ns, &argv);
        for e in expected {
            assert!(log.contains(e), "{argv:?}: no {e:?} in {log}");
        }
    }

    // Nothing was attached by any of these.
    let filters = ns.exec(&["bpftool", "net", "show", "dev", "eth0"]).unwrap();
    assert!(!filters.contains("arp_guard"), "{filters}");
}

#[test]
fn without_privileges_says_what_is_missing() {
    testbed::require_root();
    let ns = Netns::new("nopriv").unwrap();
    let bin = guard_binary();
    let mut argv = words("setpriv --reuid=65534 --regid=65534 --clear-groups");
    argv.extend(words("--inh-caps=-all --bounding-set=-all"));
    argv.push(bin.to_str().unwrap().to_string());
    argv.extend(words("run -i lo --ownership-file /dev/null --node-name n"));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let out = ns.exec_output(&argv).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("must run as root or with CAP_BPF") && err.contains("CAP_NET_ADMIN"),
        "{err}"
    );
}

#[test]
fn validate_prints_the_nodes_view() {
    let dir = std::env::temp_dir().join(format!("arp-guard-validate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("owners.yaml");
    std::fs::write(&f, testbed::bed::default_owners()).unwrap();
    let out = std::process::Command::new(guard_binary())
        .args(["validate", f.to_str().unwrap(), "--node-name", "node-b"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("198.51.100.101") && text.contains("foreign"),
        "{text}"
    );
    assert!(
        text.contains("198.51.100.102") && text.contains("owned"),
        "{text}"
    );
    std::fs::write(&f, "ips:\n  - ip: not-an-ip\n").unwrap();
    let out = std::process::Command::new(guard_binary())
        .args(["validate", f.to_str().unwrap(), "--node-name", "n"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("owners.yaml:2"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Text logs written to a pipe or file carry no ANSI colour codes.
#[test]
fn text_logs_have_no_colour_codes_off_a_terminal() {
    testbed::require_root();
    let ns = Netns::new("ansi").unwrap();
    let child = ns
        .command(&guard_binary())
        .args([
            "--log-format",
            "text",
            "run",
            "-i",
            "eth9",
            "--lb-ips-from",
            "kube-ipvs9",
            "--node-name",
            "n",
            "--listen",
            "none",
        ])
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("WARN") && log.contains("kube-ipvs9"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a piped log: {log:?}"
    );
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}
