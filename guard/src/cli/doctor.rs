//! `arp-guard doctor`: its arguments.

use std::{path::PathBuf, time::Duration};

use clap::Args;

use super::{parse_duration, Output, DEFAULT_API, DEFAULT_PIN_DIR};

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The node's announcing interface (its uplink to the LAN); repeat for
    /// several. Default: the interfaces the running guard is on, else those
    /// of the default route, else every interface with an IPv4 address.
    #[arg(short = 'i', long = "interface", value_name = "IFACE")]
    pub uplinks: Vec<String>,

    /// Interfaces whose addresses are LB IPs (as `run --lb-ips-from`: IPv4,
    /// and global IPv6); non-loopback IPv4 addresses on `lo` are checked too.
    #[arg(
        long = "lb-ips-from",
        value_name = "IFACE",
        default_value = "kube-ipvs0"
    )]
    pub lb_ifaces: Vec<String>,

    /// A client address to check the route back to (repeat for several;
    /// rp_filter is IPv4's, so an IPv6 client is named as not checked).
    /// Default: clients beyond the connected subnets, i.e. the default route.
    #[arg(long, value_name = "IP")]
    pub client: Vec<std::net::IpAddr>,

    /// Where procfs is (sysctls, mounts, routes, kernel release).
    #[arg(long, value_name = "PATH", default_value = "/proc")]
    pub proc_root: PathBuf,

    /// Where sysfs is (interfaces).
    #[arg(long, value_name = "PATH", default_value = "/sys")]
    pub sys_root: PathBuf,

    /// The running daemon's --listen address, asked for what it guards.
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_API, env = "ARP_GUARD_API")]
    pub api: std::net::SocketAddr,

    /// The daemon's --pin-dir, read when its API does not answer.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,

    /// Kubeconfig for reading kube-system/kube-proxy (default: in-cluster
    /// config, then $KUBECONFIG / ~/.kube/config).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// Do not ask the Kubernetes API (the kube-proxy check is skipped).
    #[arg(long, conflicts_with = "kubeconfig")]
    pub no_cluster: bool,

    /// How long the Kubernetes API may take to answer.
    #[arg(long, value_name = "DURATION", default_value = "3s", value_parser = parse_duration)]
    pub kube_timeout: Duration,

    /// Output format (`json`: one document with every check).
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}
