#!/usr/bin/env bash
# vm/run.sh runs agentrun's suites inside a QEMU virtual machine whose only
# cgroup hierarchy is v2 with every controller enabled, the layout most
# hosts have, for a host (like a cgroup v1 one) that has no such machine at
# hand. It boots Debian 12's kernel with cgroup_no_v1=all over a root
# filesystem made with mmdebstrap (cached), holding the test binaries and
# images of test/device/bundle.sh, and runs as root, with no network:
#
#   runtime/cgroup's tests (the v2 limits, kill, freeze, usage and OOM),
#   the tool broker's root tests (a stdio server's fence and cgroup), the
#   integration tests in $AGENTRUN_VM_RUN (by default the ones on limits,
#   kills, pools, tear-down, gc and live sandboxes), and the escape
#   battery, each on libcontainer.
#
# runsc is left out: under QEMU's emulation (TCG, some 40 times slower
# than this host) gVisor's runs take longer than the tests' timeouts, on
# v1 as on v2 (measured). So are the tests whose bounds are for a host at
# native speed: TestUsageIsTheProgramsOwn (12 ms of set-up CPU),
# TestSIGTERMCleansUp (the program started 0.7 s after agentrun) and
# TestSocketBuffersCharged (how far 12 s of filling gets). The device
# machine (test/device) runs them all. AGENTRUN_VM_CGROUP=v1 boots the
# same machine with v1 hierarchies instead, to tell emulation from v2.
#
# Logs go to _vm/ (console.log, cgroup.log, integration.log, escape.log).
# On 2 cores: about 5 minutes for the bundle, 2 for the first mmdebstrap
# and 4 in the machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=${AGENTRUN_VM_CGROUP:-v2}
case $mode in v1 | v2) ;; *) echo "vm/run.sh: AGENTRUN_VM_CGROUP is v1 or v2, not $mode" >&2; exit 2 ;; esac
run=${AGENTRUN_VM_RUN:-'^(TestSumPrints45|TestForkBombHitsPidsLimit|TestMemoryHogIsOOMKilled|TestInfiniteLoopTimesOut|TestTmpFullGivesENOSPC|TestSetsidDoubleForkDiesAtTimeout|TestTimeoutKillsProgramWithoutMainThread|TestConcurrentRunsAreIsolated|TestMissingProgramRollsBack|TestCancelledBeforeTheProgramStarts|TestPoolEnforcesLimits|TestPoolProgramStartsAhead|TestPoolExecFailsAsCold|TestMountsHeldUntilTearDown|TestPoolDropsDeadSandboxes|TestPoolStoppedSandboxDoesNotHang|TestGCAfterSIGKILL|TestRunUIDsOwnUserLimits|TestServeSIGKILLThenGC|TestLiveSandbox|TestLiveSandboxExpires|TestServeLiveSandboxes)$'}
timeout=${AGENTRUN_VM_TIMEOUT:-3600}
cache=${AGENTRUN_VM_CACHE:-/var/cache/agentrun/vm}
work=${AGENTRUN_VM_WORK:-/var/tmp/agentrun-vm}

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v debugfs >/dev/null || need+=(e2fsprogs)
if [ ${#need[@]} -gt 0 ]; then
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

# The machine's root filesystem: Debian 12 with its kernel and initramfs.
base=$cache/bookworm-kernel.tar
if [ ! -s "$base" ]; then
	mkdir -p "$cache"
	mmdebstrap --variant=minbase --include=linux-image-amd64,initramfs-tools,kmod,iproute2,tini,ca-certificates \
		bookworm "$cache/.new.tar" # mmdebstrap takes the format from the name
	mv "$cache/.new.tar" "$base"
fi
[ -n "${AGENTRUN_VM_BUNDLE:-}" ] || { test/device/bundle.sh && AGENTRUN_VM_BUNDLE=_device/bundle.tar.xz; }

rm -rf "$work" && mkdir -p "$work/root/opt/d"
root=$work/root
tar -C "$root" -xf "$base"
xz -d <"$AGENTRUN_VM_BUNDLE" | tar -C "$root/opt/d" -xf -
kernel=$work/vmlinuz initrd=$work/initrd.img
cp "$(ls "$root"/boot/vmlinuz-* | head -1)" "$kernel"
cp "$(ls "$root"/boot/initrd.img-* | head -1)" "$initrd"
printf '%s\n' "$run" >"$root/run.pattern"

# PID 1: mounts what a host has, the cgroup hierarchy of $mode, runs the
# suites, powers off.
cat >"$root/init.sh" <<'EOF'
#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t devtmpfs dev /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm /out
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
mount -t tmpfs -o size=2g tmpfs /tmp
if grep -q cgroup_no_v1=all /proc/cmdline; then
	mount -t cgroup2 cgroup2 /sys/fs/cgroup
	for c in $(cat /sys/fs/cgroup/cgroup.controllers); do echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control; done
else
	mount -t tmpfs -o mode=755 cgroup_root /sys/fs/cgroup
	for c in cpuset cpu,cpuacct blkio memory devices freezer net_cls,net_prio perf_event hugetlb pids rdma misc; do
		mkdir -p /sys/fs/cgroup/$c && mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c
	done
	ln -s cpu,cpuacct /sys/fs/cgroup/cpu; ln -s cpu,cpuacct /sys/fs/cgroup/cpuacct
	mkdir -p /sys/fs/cgroup/unified && mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified
fi
ip link set lo up
# An address besides loopback, as a host has: the escape battery probes it.
ip link add host0 type dummy && ip addr add 192.0.2.1/24 dev host0 && ip link set host0 up
/suites.sh >/out/console.log 2>&1
echo $? >/out/rc
sync
echo o >/proc/sysrq-trigger
sleep 30
EOF
cat >"$root/suites.sh" <<'EOF'
#!/bin/bash
set -u
w=/opt/d
export AGENTRUN_IMAGES=$w/images AGENTRUN_SKIP_IMAGE_BUILD=1 AGENTRUN_SKIP_RUNSC_BUILD=1 \
	AGENTRUN_RUNSC=$w/bin/runsc AGENTRUN_BIN=$w/bin/agentrun AGENTRUN_ESCAPE_PROBE=$w/bin/probe
export PATH=$w/bin:$PATH HOME=/root
uname -r; nproc; stat -fc %T /sys/fs/cgroup; cat /proc/self/cgroup
cat /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
rc=0
cd $w/bin
suite() {
	name=$1; shift
	echo "=== $name $(date +%T)"
	"./$name.test" -test.v -test.count=1 -test.timeout 1800s "$@" >/out/$name.log 2>&1
	r=$?
	[ $r -eq 0 ] || rc=$r
	grep -E '^(--- FAIL|FAIL|ok|PASS)' /out/$name.log | head -40
	echo "passed: $(grep -cE '^\s*--- PASS' /out/$name.log), exit $r"
}
suite cgroup
suite toolbroker -test.run '^TestRoot'
suite integration -test.run "$(cat /run.pattern)" -test.skip '/runsc$'
suite escape -test.run 'TestEscapeBattery/^libcontainer'
echo "--- left: $(ls -d /sys/fs/cgroup/agentrun* /sys/fs/cgroup/*/agentrun* 2>/dev/null | tr '\n' ' ')"
ls /run/agentrun/state 2>/dev/null
exit $rc
EOF
chmod 0755 "$root/init.sh" "$root/suites.sh"
truncate -s 6G "$work/disk.img"
mkfs.ext4 -q -F -d "$root" "$work/disk.img"
rm -rf "$root"

cmdline="root=/dev/vda rw console=ttyS0 init=/init.sh panic=-1 quiet"
[ "$mode" = v1 ] || cmdline="$cmdline cgroup_no_v1=all"
cpus=$(nproc)
[ "$cpus" -le 4 ] || cpus=4
echo "vm/run.sh: booting (cgroup $mode, $cpus CPUs, TCG); the suites' summary follows when it powers off"
timeout "$timeout" qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m 6144 -smp "$cpus" \
	-nographic -no-reboot -nic none -kernel "$kernel" -initrd "$initrd" \
	-drive "file=$work/disk.img,if=virtio,format=raw" -append "$cmdline" >"$work/boot.log" 2>&1 || {
	r=$?
	if [ $r -eq 124 ]; then
		echo "vm/run.sh: the machine did not power off within ${timeout}s (boot log: $work/boot.log)" >&2
	else
		echo "vm/run.sh: qemu failed (exit $r): $(tail -3 "$work/boot.log")" >&2
	fi
	exit 1
}
rm -rf _vm && mkdir -p _vm
debugfs -R "rdump /out _vm" "$work/disk.img" >/dev/null 2>&1
mv _vm/out/* _vm/ && rmdir _vm/out
cat _vm/console.log
[ -s _vm/rc ] || { echo "vm/run.sh: the suites did not finish (boot log: $work/boot.log)" >&2; exit 1; }
rm -f "$work/disk.img"
exit "$(cat _vm/rc)"
