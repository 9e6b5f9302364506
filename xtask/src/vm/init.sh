#!/bin/busybox sh
# /init of the VM lane (written by xtask/src/vm/rootfs.rs): mount what the
# tests expect, load the modules, run the test binaries, print one status
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
# The test binaries run in @JOBS@ workers. Each worker claims the next
# binary not yet claimed (mkdir is atomic; busybox has no flock), so the
# slow ones given first do not leave a worker idle at the end. With more
# than one worker a binary's output is held and printed whole when it
# ends; with one it streams (a hang shows where it hangs). Each is killed
# past @DEADLINE@ s (xtask's BINARY_DEADLINE): a hung binary is named, and
# the others still run, well before the VM's own timeout.
rm -f /tmp/failed
print_lock() { until mkdir /tmp/print.lock 2>/dev/null; do sleep 0.1; done; }
# Killed by timeout: status 137 (128 + 9) once the deadline has passed
# (an OOM kill before it has the same status).
deadline_note() {
    if [ "$rc" = 137 ] && [ $(( $(date +%s) - start )) -ge @DEADLINE@ ]; then
        echo "vm: $name passed its deadline of @DEADLINE@ s: killed"
    fi
}
run_test() {
    name=$1
    shift
    start=$(date +%s)
    if [ @JOBS@ = 1 ]; then
        echo "vm: running $name"
        (cd /tmp && timeout -s KILL @DEADLINE@ "$@")
        rc=$?
        deadline_note
        echo "vm: $name exited $rc after $(( $(date +%s) - start )) s"
    else
        (cd /tmp && timeout -s KILL @DEADLINE@ "$@") >"/tmp/out-$name" 2>&1
        rc=$?
        deadline_note >>"/tmp/out-$name"
        print_lock
        echo "vm: running $name"
        cat "/tmp/out-$name"
        echo "vm: $name exited $rc after $(( $(date +%s) - start )) s"
        rmdir /tmp/print.lock
        rm -f "/tmp/out-$name"
    fi
    [ "$rc" = 0 ] || echo "$name" >>/tmp/failed
}
run_named() {
    case "$1" in
@TESTS@    esac
}
worker() {
    for t in @NAMES@; do
        mkdir "/tmp/claim-$t" 2>/dev/null || continue
        run_named "$t"
    done
}
for w in $(seq @JOBS@); do
    worker &
done
wait
failed=$(cat /tmp/failed 2>/dev/null | tr '\n' ' ')
status=0
[ -z "$failed" ] || status=1
echo "vm: failed: ${failed:-none}"
echo "ARP-GUARD-VM-STATUS $status"
sync
poweroff -f
