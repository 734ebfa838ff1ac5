#!/bin/sh
# The guest's first process (busybox, from the initramfs). The kernel hands
# it the cmdline's KVER, RESULTS and RUNNER as environment variables. It
# builds the root: the host's / (read-only, 9p) under a tmpfs overlay, then
# hands over to the harness binary (RUNNER -guest), which runs the suites
# and powers off. A failure here ends in a panic, which ends qemu (panic=-1,
# -no-reboot).
export PATH=/bin
fail() { echo "coordino-init: $*"; exec poweroff -f; }
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules); do insmod "/lib/modules/$m" || fail "insmod $m"; done

mkdir -p /host /rw /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,ro hostroot /host || fail "mount hostroot"
mount -t tmpfs -o mode=755 rw /rw
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work root /newroot || fail "mount overlay"

r=/newroot
mount -o move /proc $r/proc
mount -o move /sys $r/sys
mount -o move /dev $r/dev
mkdir -p $r/dev/pts $r/dev/shm
mount -t devpts devpts $r/dev/pts
mount -t tmpfs shm $r/dev/shm
# /tmp stays the overlay's (writable in tmpfs): the repository may live there.
mount -t tmpfs -o mode=755 run $r/run
mount -t bpf bpf $r/sys/fs/bpf
mount -t cgroup2 cgroup2 $r/sys/fs/cgroup
mount -t tracefs tracefs $r/sys/kernel/tracing 2>/dev/null
mount -t debugfs debugfs $r/sys/kernel/debug 2>/dev/null
mkdir -p $r/lib/modules/$KVER "$r$RESULTS"
mount -o bind "$r$MODULES" $r/lib/modules/$KVER || fail "bind modules"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 results "$r$RESULTS" || fail "mount results"
hostname guest
exec switch_root $r "$RUNNER" -guest "$RESULTS/plan.json"
