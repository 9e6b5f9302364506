#!/bin/busybox sh
# /init of the VM lane (written by xtask/src/vm/rootfs.rs): mount what the
# tests expect, load the modules, run each test binary, print one status
# line the host reads, power off. Nothing here may hang the lane: the host
# kills the VM at its timeout.
/bin/busybox --install -s /bin
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root TMPDIR=/tmp RUST_BACKTRACE=1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
# /tmp stays part of the initramfs (already in RAM): the binaries may live
# under it at their host paths (a checkout in /tmp), and a tmpfs would hide them.
chmod 1777 /tmp
mount -t tmpfs tmpfs /run
mount -t bpf bpf /sys/fs/bpf
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
ip link set lo up
for m in @MODULES@; do
    insmod "/modules/$m.ko" || echo "vm: insmod $m failed"
done
@ENV@
echo "vm: lane @LANE@, Linux $(uname -r), $(grep -c ^processor /proc/cpuinfo) CPUs, $(awk '/MemTotal/ {print $2/1024 " MiB"}' /proc/meminfo)"
status=0
failed=""
run_test() {
    name=$1
    shift
    echo "vm: running $name"
    start=$(date +%s)
    cd /tmp
    "$@"
    rc=$?
    echo "vm: $name exited $rc after $(( $(date +%s) - start )) s"
    if [ "$rc" != 0 ]; then
        status=1
        failed="$failed $name"
    fi
}
@TESTS@
echo "vm: failed:${failed:- none}"
echo "ARP-GUARD-VM-STATUS $status"
sync
poweroff -f
