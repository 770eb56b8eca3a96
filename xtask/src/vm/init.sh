#!/bin/busybox sh
# PID 1 of a meshlab VM guest (built into the initramfs by `cargo xtask vm prepare`).
# Mounts the host's / read-only over 9p under a tmpfs overlay, mounts the kernel filesystems eBPF
# tools need, configures the private link, runs the host-written script as root in a chroot of
# that root, records its exit status in the run directory (9p, read-write), and powers off.
# Anything that fails before the status is written leaves it missing: the host reports that and
# shows the tail of this console log.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

stop() {
    sync
    # qemu runs with -no-reboot: a reset ends it at once (power-off needs ACPI to cooperate).
    reboot -f
    sleep 5
    echo b >/proc/sysrq-trigger
}
fail() {
    echo "meshlab-init: FAILED: $*"
    stop
}
param() {
    for word in $(cat /proc/cmdline); do
        case "$word" in "meshlab.$1="*) echo "${word#*=}" ;; esac
    done
}
NAME=$(param name)
ADDR=$(param addr)
PEER=$(param peer)
ADDR2=$(param addr2)
PEER2=$(param peer2)

for module in $(cat /modules.order); do
    insmod "/lib/modules/$module" || fail "insmod $module"
done

# 9p needs the virtio devices probed; they appear asynchronously after virtio_pci loads.
for _ in $(seq 50); do
    grep -q hostroot /sys/bus/virtio/drivers/9pnet_virtio/*/mount_tag 2>/dev/null && break
    sleep 0.1
done
NINEP="trans=virtio,version=9p2000.L,msize=512000"
mount -t 9p -o "$NINEP,ro,cache=loose" hostroot /mnt/host || fail "mount 9p hostroot"
mount -t tmpfs -o mode=0755 tmpfs /mnt/rw || fail "mount tmpfs"
mkdir -p /mnt/rw/upper /mnt/rw/work
mount -t overlay -o lowerdir=/mnt/host,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work overlay /mnt/root ||
    fail "mount overlay"

R=/mnt/root
mount -t proc proc $R/proc
mount -t sysfs sysfs $R/sys
mount -t devtmpfs devtmpfs $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts devpts $R/dev/pts
mount -t tmpfs tmpfs $R/dev/shm
# /tmp stays the overlay's (writable, host files visible); /run starts empty as on a boot.
mount -t tmpfs tmpfs $R/run
# What eBPF tools expect: tracefs, debugfs, bpffs and a cgroup2 hierarchy.
mount -t tracefs tracefs $R/sys/kernel/tracing || fail "mount tracefs"
mount -t debugfs debugfs $R/sys/kernel/debug || fail "mount debugfs"
mount -t bpf bpf $R/sys/fs/bpf || fail "mount bpffs"
mount -t cgroup2 cgroup2 $R/sys/fs/cgroup || fail "mount cgroup2"
# Busybox applets the host lacks (ping, ...): appended to PATH by the guest script.
mkdir -p $R/run/busybox
cp /bin/busybox $R/run/busybox/busybox
chroot $R /run/busybox/busybox --install -s /run/busybox
RUN=$R/run/meshlab
mkdir -p $RUN
mount -t 9p -o "$NINEP" meshlab_run $RUN || fail "mount 9p meshlab_run"
# Extra read-write host directories: "tag path" lines written by the host.
while read -r tag path; do
    [ -n "$tag" ] && { mount -t 9p -o "$NINEP" "$tag" "$R$path" || fail "mount $tag at $path"; }
done <$RUN/rw-mounts

hostname "meshlab-$NAME"
ip link set lo up
if [ -n "$ADDR" ]; then
    ip link set eth0 up || fail "no eth0"
    ip addr add "$ADDR" dev eth0 || fail "ip addr add $ADDR"
    # Barrier: both guests start their commands once the link works both ways.
    for _ in $(seq 300); do
        ping -c 1 -W 1 "$PEER" >/dev/null 2>&1 && break
    done
fi
if [ -n "$ADDR2" ]; then
    ip link set eth1 up || fail "no eth1"
    ip addr add "$ADDR2" dev eth1 || fail "ip addr add $ADDR2"
    ok=
    for _ in $(seq 300); do
        ping -c 1 -W 1 "$PEER2" >/dev/null 2>&1 && ok=1 && break
    done
    # The first link's barrier waits for the peer's boot; this one only for a link that works.
    [ -n "$ok" ] || fail "no answer from $PEER2 on eth1"
fi

echo "meshlab-init: guest $NAME running its command"
# The host boots again (once) when a guest dies before any guest got here (guest.rs).
: >"$RUN/$NAME.started"
chroot $R /bin/sh "/run/meshlab/$NAME.script" </dev/null >"$RUN/$NAME.stdout" 2>"$RUN/$NAME.stderr"
echo $? >"$RUN/$NAME.status.tmp"
mv "$RUN/$NAME.status.tmp" "$RUN/$NAME.status"
echo "meshlab-init: guest $NAME done, status $(cat "$RUN/$NAME.status")"
# Keep the link up until the peer's command is done too (the run directory is shared).
if [ -n "$PEER" ]; then
    [ "$NAME" = a ] && OTHER=b || OTHER=a
    while [ ! -e "$RUN/$OTHER.status" ]; do sleep 0.2; done
fi
stop
