//! The OCI image `cargo xtask image` writes, in a real container runtime
//! (podman + runc, private storage): it loads, it answers `--version`,
//! `validate` reads an ownership file mounted into it, and `run` guards a
//! veth in a test namespace with exactly the privileges the DaemonSet
//! declares (capabilities, user, allowPrivilegeEscalation,
//! readOnlyRootFilesystem and seccompProfile from
//! `deploy/base/daemonset.yaml`; RuntimeDefault as containerd has it, see
//! `testbed::container::runtime_default_seccomp`), with the bpffs mounted
//! like systemd mounts it (mode 0700). A foreign LB IP's ARP reply must not reach the
//! neighbour, and `/metrics` must answer inside the namespace.
//!
//! The archive: `$ARP_GUARD_IMAGE`, else `cargo xtask image` (see
//! `testbed::container::image_archive`). An arm64 image in the archive
//! (`cargo xtask image --arch amd64,arm64`) is run under qemu-user (an ignored test: `--ignored`).

use std::{path::Path, time::Duration};

use testbed::{
    bed::{Bed, Bpffs, TempDir, FOREIGN, NODE, OTHER, OWNED},
    cluster_bed::ClusterBed,
    container::{image_archive, runtime_default_seccomp, Container, Podman},
    deploy::Security,
    fake_api::{objects, Resource},
    wait_for, wait_until,
};

const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Where the image carries Debian's CA bundle (xtask/src/image.rs CA_BUNDLE).
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Load the image into a fresh store; (store, image name).
fn loaded(tag: &str) -> (Podman, String) {
    let archive = image_archive();
    let podman = Podman::new(tag).unwrap();
    let image = podman.load(&archive).unwrap();
    (podman, image)
}

fn inspect(podman: &Podman, image: &str, format: &str) -> String {
    podman
        .run(&["image", "inspect", "--format", format, image])
        .unwrap()
        .trim()
        .to_owned()
}

/// The value of field `name` (e.g. "CapEff:") of /proc/<pid>/status.
fn proc_status(pid: u32, name: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
        .trim()
        .to_owned()
}

/// The DaemonSet's seccomp profile type (the container's over the pod's);
/// Kubernetes' default without one is Unconfined.
fn seccomp_type() -> String {
    let ds = testbed::deploy::daemonset();
    let pod = &ds["spec"]["template"]["spec"];
    pod["containers"][0]["securityContext"]["seccompProfile"]["type"]
        .as_str()
        .or(pod["securityContext"]["seccompProfile"]["type"].as_str())
        .unwrap_or("Unconfined")
        .to_owned()
}

/// `podman run` flags for the DaemonSet's container security context.
fn security_flags(s: &Security, seccomp: &str, dir: &Path) -> Vec<String> {
    let mut f = vec!["--cap-drop=all".to_owned()];
    f.extend(s.caps.iter().map(|c| format!("--cap-add=CAP_{c}")));
    if let Some(uid) = s.run_as_user {
        f.push(format!("--user={uid}"));
    }
    if s.allow_privilege_escalation == Some(false) {
        f.push("--security-opt=no-new-privileges".into());
    }
    if s.read_only_root {
        // Kubernetes mounts nothing writable over a read-only root; podman
        // would add tmpfs on /tmp, /var/tmp and /run unless told not to.
        f.extend(["--read-only".into(), "--read-only-tmpfs=false".into()]);
    }
    let profile = match seccomp {
        "RuntimeDefault" => runtime_default_seccomp(dir).unwrap().display().to_string(),
        "Unconfined" => "unconfined".to_owned(),
        other => panic!("seccompProfile {other}: teach the test what it means"),
    };
    f.push(format!("--security-opt=seccomp={profile}"));
    f
}

#[test]
fn image_is_only_the_static_binary_and_answers_version_and_validate() {
    testbed::require_root();
    let (podman, image) = loaded("cli");

    // What the image says about itself.
    assert_eq!(inspect(&podman, &image, "{{.Architecture}}"), "amd64");
    assert_eq!(
        inspect(&podman, &image, "{{json .Config.Entrypoint}}"),
        r#"["/usr/local/bin/arp-guard"]"#
    );
    assert_eq!(inspect(&podman, &image, "{{len .RootFS.Layers}}"), "1");
    let labels: serde_json::Value =
        serde_json::from_str(&inspect(&podman, &image, "{{json .Labels}}")).unwrap();
    assert_eq!(labels["org.opencontainers.image.version"], VERSION);
    assert_eq!(labels["org.opencontainers.image.title"], "arp-guard");
    for key in ["source", "licenses", "created", "revision"] {
        let v = &labels[format!("org.opencontainers.image.{key}")];
        assert!(v.as_str().is_some_and(|s| !s.is_empty()), "{key}: {labels}");
    }

    // Its file system: the binary, Debian's CA bundle and the directories
    // leading to them.
    let dir = TempDir::new("image-fs").unwrap();
    let export = dir.path().join("rootfs.tar");
    podman
        .run(&["create", "--name", "fs", &image])
        .expect("create");
    podman
        .run(&["export", "-o", export.to_str().unwrap(), "fs"])
        .unwrap();
    let list = std::process::Command::new("tar")
        .arg("-tvf")
        .arg(&export)
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    let mut files: Vec<&str> = list
        .lines()
        .filter(|l| !l.starts_with('d'))
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    files.sort();
    // (A runtime may add empty mount points, never files.)
    assert_eq!(
        files,
        [CA_BUNDLE.trim_start_matches('/'), "usr/local/bin/arp-guard"],
        "{list}"
    );
    let bundle = list
        .lines()
        .find(|l| l.ends_with(&format!(" {}", CA_BUNDLE.trim_start_matches('/'))))
        .unwrap_or_else(|| panic!("{list}"));
    assert!(bundle.starts_with("-rw-r--r--"), "{bundle}");
    let binary = list
        .lines()
        .find(|l| l.ends_with(" usr/local/bin/arp-guard"))
        .unwrap_or_else(|| panic!("{list}"));
    let cols: Vec<&str> = binary.split_whitespace().collect();
    assert_eq!(cols[0], "-rwxr-xr-x", "{binary}");
    assert!(["0/0", "root/root"].contains(&cols[1]), "{binary}");

    // --version, in a container with podman's defaults.
    let mut args = vec!["run".to_owned(), "--rm".into(), "--network=none".into()];
    args.extend(Podman::ulimits());
    let run = |extra: &[&str]| {
        let mut a = args.clone();
        a.extend(extra.iter().map(|s| s.to_string()));
        podman.run(&a)
    };
    let v = run(&[&image, "--version"]).unwrap();
    assert_eq!(v.trim(), format!("arp-guard {VERSION}"));

    // validate, with no capability at all, on a read-only root, reading an
    // ownership file mounted like the DaemonSet's ConfigMap.
    let owners = dir.path().join("owners");
    std::fs::create_dir(&owners).unwrap();
    std::fs::write(owners.join("owners.yaml"), testbed::bed::default_owners()).unwrap();
    let volume = format!("--volume={}:/etc/arp-guard:ro", owners.display());
    let view = run(&[
        "--cap-drop=all",
        "--read-only",
        "--user=65532:65532",
        &volume,
        &image,
        "validate",
        "--node-name",
        NODE,
        "/etc/arp-guard/owners.yaml",
    ])
    .unwrap();
    assert!(view.contains("/etc/arp-guard/owners.yaml: valid"), "{view}");
    let line = |ip: std::net::Ipv4Addr| {
        view.lines()
            .find(|l| l.contains(&format!(" {ip} ")))
            .unwrap_or_else(|| panic!("no {ip} in {view}"))
            .to_owned()
    };
    assert!(line(OWNED).contains(&format!("owner={NODE}")) && line(OWNED).ends_with("owned"));
    assert!(
        line(FOREIGN).contains(&format!("owner={OTHER}")) && line(FOREIGN).ends_with("foreign")
    );
    // A broken file is an error, with the file named.
    std::fs::write(owners.join("owners.yaml"), "ips: [{ip: 300.1.1.1}]\n").unwrap();
    let mut bad = args.clone();
    bad.extend(
        [
            volume.as_str(),
            &image,
            "validate",
            "/etc/arp-guard/owners.yaml",
        ]
        .map(str::to_owned),
    );
    let out = podman.output(&bad).unwrap();
    assert!(!out.status.success(), "validate accepted a bad file");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("owners.yaml"), "{err}");
}

#[test]
fn image_runs_the_guard_with_the_daemonsets_privileges() {
    testbed::require_root();
    let security = testbed::deploy::security();
    let (podman, image) = loaded("run");
    let bed = Bed::new("img").unwrap();
    // systemd mounts /sys/fs/bpf with mode 0700; the DaemonSet mounts it at
    // the same path.
    let fs = Bpffs::new("img").unwrap();
    std::fs::set_permissions(
        fs.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o1700),
    )
    .unwrap();
    let seccomp = seccomp_type();

    let mut args = security_flags(&security, &seccomp, bed.dir.path());
    args.extend(Podman::ulimits());
    args.extend([
        format!("--network=ns:/run/netns/{}", bed.node.name),
        format!("--volume={}:/etc/arp-guard:ro", bed.dir.path().display()),
        format!("--volume={}:/sys/fs/bpf:rslave", fs.path().display()),
        // The DaemonSet's emptyDir (medium: Memory) for the status file.
        "--tmpfs=/run/arp-guard".into(),
        image.clone(),
        "--log-format=json".into(),
        "run".into(),
    ]);
    args.extend(
        [
            "--interface=eth0",
            "--node-name",
            NODE,
            "--ownership-file=/etc/arp-guard/owners.yaml",
            "--lb-ips-from=kube-ipvs0",
            "--file-poll=200ms",
            "--status-file=/run/arp-guard/status.json",
            "--pin-dir=/sys/fs/bpf/arp-guard",
            "--on-exit=keep",
        ]
        .map(str::to_owned),
    );
    let guard = Container::start(&podman, "arp-guard", &args).unwrap();
    let enforcing = wait_until(Duration::from_secs(30), || {
        guard.logs().contains("arp-guard is enforcing") || !guard.running()
    });
    let logs = guard.logs();
    assert!(
        enforcing && logs.contains("arp-guard is enforcing"),
        "the guard did not start in the container ({security:?}); its log:\n{logs}"
    );

    // The test itself must be right: the process runs with exactly what the
    // manifest declares.
    let pid = guard.pid().unwrap();
    let cap_eff = u64::from_str_radix(&proc_status(pid, "CapEff:"), 16).unwrap();
    assert_eq!(
        cap_eff,
        testbed::deploy::cap_bits(&security.caps),
        "the guard runs with exactly {:?}",
        security.caps
    );
    // Kubernetes (containerd, CRI-O) sets no ambient or inheritable
    // capabilities; podman does for a non-root --user, which would let a
    // non-root manifest pass here and fail on a node.
    for set in ["CapAmb:", "CapInh:"] {
        assert_eq!(
            proc_status(pid, set),
            "0000000000000000",
            "{set} podman's ambient capabilities for a non-root user are not what a pod gets"
        );
    }
    let uid = proc_status(pid, "Uid:");
    let image_user = inspect(&podman, &image, "{{.User}}");
    let want_uid = security
        .run_as_user
        .map(|u| u.to_string())
        .unwrap_or_else(|| image_user.split(':').next().unwrap_or("0").to_owned());
    assert_eq!(
        uid.split_whitespace().next(),
        Some(want_uid.as_str()),
        "Uid: {uid}"
    );
    let nnp = security.allow_privilege_escalation == Some(false);
    assert_eq!(proc_status(pid, "NoNewPrivs:"), if nnp { "1" } else { "0" });
    assert_eq!(
        proc_status(pid, "Seccomp:"),
        if seccomp == "Unconfined" { "0" } else { "2" },
        "seccompProfile {seccomp}"
    );
    // Its pins are where the next pod finds them.
    assert!(
        fs.path().join("arp-guard").is_dir(),
        "no pin directory on the bpffs"
    );

    // Enforcement: the neighbour learns the owned IP, never the foreign one.
    bed.peer.flush_neigh("eth0").unwrap();
    for ip in [OWNED, FOREIGN] {
        bed.peer.poke(&ip.to_string()).unwrap();
    }
    let learned = wait_for(Duration::from_secs(3), || {
        bed.peer.cached_mac("eth0", &OWNED.to_string()).unwrap()
    });
    assert_eq!(learned, Some(bed.node_mac), "{}", guard.logs());
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        bed.peer.cached_mac("eth0", &FOREIGN.to_string()).unwrap(),
        None,
        "the foreign LB IP's reply reached the neighbour"
    );

    // The API, from inside the namespace the container shares.
    testbed::deploy::assert_api_shows_the_foreign_drop(&bed.node);

    // SIGTERM ends it cleanly (the DaemonSet's rolling update).
    assert_eq!(guard.stop(10).unwrap(), 0, "{}", guard.logs());
}

/// A kubeconfig that names no CA, for an API over plain HTTP (the fake
/// API): the image syncs from it with its CA bundle, and also with the
/// bundle hidden (an empty directory over /etc/ssl/certs), since plain HTTP
/// needs no roots (it used to fail at start: "No CA certificates were
/// loaded from the system"). With the DaemonSet's privileges, as above.
#[test]
fn image_syncs_from_a_kubeconfig_that_names_no_ca() {
    testbed::require_root();
    let security = testbed::deploy::security();
    let seccomp = seccomp_type();
    let bed = ClusterBed::new("imgkc", &["198.51.100.100".parse().unwrap()]).unwrap();
    bed.api.apply(
        Resource::Services,
        objects::service("default", "web", &["198.51.100.100"]),
    );
    let kubeconfig = std::fs::read_to_string(&bed.kubeconfig).unwrap();
    assert!(
        kubeconfig.contains("server: http://") && !kubeconfig.contains("certificate-authority"),
        "{kubeconfig}"
    );
    let (podman, image) = loaded("kubeconfig");
    let no_roots = TempDir::new("no-roots").unwrap();
    let fs = Bpffs::new("imgkc").unwrap();
    for hidden in [false, true] {
        let mut args = security_flags(&security, &seccomp, bed.dir.path());
        args.extend(Podman::ulimits());
        args.extend([
            format!("--network=ns:/run/netns/{}", bed.nodes[0].ns.name),
            format!("--volume={}:/etc/arp-guard:ro", bed.dir.path().display()),
            format!("--volume={}:/sys/fs/bpf:rslave", fs.path().display()),
            "--tmpfs=/run/arp-guard".into(),
        ]);
        if hidden {
            args.push(format!(
                "--volume={}:/etc/ssl/certs:ro",
                no_roots.path().display()
            ));
        }
        args.push(image.clone());
        args.extend(
            [
                "run",
                "--interface=eth0",
                "--node-name=node-a",
                "--kubeconfig=/etc/arp-guard/kubeconfig",
                "--lb-ips-from=kube-ipvs0",
                "--announcer=cilium",
                "--status-file=/run/arp-guard/status.json",
                "--pin-dir=/sys/fs/bpf/arp-guard",
            ]
            .map(str::to_owned),
        );
        let name = if hidden { "no-roots" } else { "roots" };
        let guard = Container::start(&podman, name, &args).unwrap();
        let synced = "initial sync from the Kubernetes API done";
        let done = wait_until(Duration::from_secs(30), || {
            guard.logs().contains(synced) || !guard.running()
        });
        let logs = guard.logs();
        assert!(
            done && logs.contains(synced),
            "the image did not sync from a kubeconfig naming no CA (bundle hidden: {hidden}); its log:\n{logs}"
        );
        assert!(!logs.contains("No CA certificates"), "{logs}");
        assert_eq!(guard.stop(10).unwrap(), 0, "{}", guard.logs());
    }
}

/// Not in the default run: a cold arm64 cross-build takes about 17 minutes
/// on this 2-core machine (`cargo xtask image --arch amd64,arm64` also
/// smoke-runs the arm64 binary under qemu-user before it writes the archive).
#[test]
#[ignore = "needs ARP_GUARD_IMAGE=<archive of `cargo xtask image --arch amd64,arm64`>"]
fn arm64_image_runs_under_qemu_user() {
    testbed::require_root();
    let archive = image_archive();
    let podman = Podman::new("arm64").unwrap();
    let Some(id) = podman.pull_arch(&archive, "arm64").unwrap() else {
        panic!(
            "{} holds no arm64 image: build one with `cargo xtask image --arch amd64,arm64` and pass it as ARP_GUARD_IMAGE",
            archive.display()
        );
    };
    // No binfmt_misc registration (that would change the host for
    // everyone): qemu-user is the entrypoint, the image's binary its argument.
    let qemu = "/usr/bin/qemu-aarch64-static";
    assert!(
        Path::new(qemu).exists(),
        "{qemu}: apt-get install qemu-user-static"
    );
    let dir = TempDir::new("arm64").unwrap();
    std::fs::write(
        dir.path().join("owners.yaml"),
        testbed::bed::default_owners(),
    )
    .unwrap();
    let run = |extra: &[&str]| {
        let mut a: Vec<String> = [
            "run",
            "--rm",
            "--arch=arm64",
            "--network=none",
            "--cap-drop=all",
            "--read-only",
            "--entrypoint=/qemu",
        ]
        .map(str::to_owned)
        .to_vec();
        a.extend(Podman::ulimits());
        a.push(format!("--volume={qemu}:/qemu:ro"));
        a.push(format!(
            "--volume={}:/etc/arp-guard:ro",
            dir.path().display()
        ));
        a.push(id.clone());
        a.push("/usr/local/bin/arp-guard".into());
        a.extend(extra.iter().map(|s| s.to_string()));
        podman.run(&a).unwrap()
    };
    assert_eq!(run(&["--version"]).trim(), format!("arp-guard {VERSION}"));
    let view = run(&[
        "validate",
        "--node-name",
        NODE,
        "/etc/arp-guard/owners.yaml",
    ]);
    assert!(view.contains(": valid"), "{view}");
    assert!(
        view.contains(&FOREIGN.to_string()) && view.contains("foreign"),
        "{view}"
    );
}
