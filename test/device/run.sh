#!/usr/bin/env bash
# run.sh runs agentrun's suites on the device machine from _device/bundle.tar.xz
# (made by test/device/bundle.sh), writing logs under $OUT.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/agentrun-device-out}
mkdir -p "$OUT"
w=/tmp/agentrun-device
rm -rf "$w" && mkdir -p "$w"
xz -d <_device/bundle.tar.xz | tar -C "$w" -xf -
# The sandbox's init where the config's default expects it.
[ -x /usr/bin/tini-static ] || install -o root -g root -m 0755 "$w/bin/tini-static" /usr/bin/tini-static
export AGENTRUN_IMAGES=$w/images AGENTRUN_SKIP_IMAGE_BUILD=1 AGENTRUN_SKIP_RUNSC_BUILD=1 \
	AGENTRUN_RUNSC=$w/bin/runsc AGENTRUN_BIN=$w/bin/agentrun AGENTRUN_ESCAPE_PROBE=$w/bin/probe
export PATH=$w/bin:$PATH # nats-server
{
	uname -a; cat /etc/os-release | head -2; nproc; free -g | head -2
	echo "--- cgroups"; stat -fc %T /sys/fs/cgroup; cat /sys/fs/cgroup/cgroup.controllers; cat /sys/fs/cgroup/cgroup.subtree_control; cat /proc/self/cgroup
	echo "--- doctor"; echo '{"runsc":{"path":"'"$w"'/bin/runsc","flags":[]}}' >"$w/doctor.json"
	"$w/bin/agentrun" doctor --config "$w/doctor.json"
} >"$OUT/host.txt" 2>&1
cat "$OUT/host.txt"
rc=0
# The python OCI layout does not fit the carry and docker-registry cannot be
# installed there: TestPullRegistryPython is skipped by name, and so reported;
# so is TestMCPTypeScriptClient (no Node or npm registry there).
for t in cgroup integration escape; do
	echo "=== $t"
	timeout 300 "$w/bin/$t.test" -test.v -test.count=1 -test.timeout 280s -test.skip 'TestPullRegistryPython|TestMCPTypeScriptClient' >"$OUT/$t.log" 2>&1
	r=$?
	[ $r -eq 0 ] || rc=$r
	grep -E '^(--- FAIL|FAIL|ok|PASS)' "$OUT/$t.log" | head -40
	grep -cE '^\s*--- PASS' "$OUT/$t.log" | sed 's/^/passed: /'
	echo "exit $r"
done
# The bench: what is not there (runc, bwrap, skopeo, a registry) is
# reported as not measured.
echo "=== bench"
timeout 240 "$w/bin/bench" -n 20 -agentrun "$w/bin/agentrun" -images "$w/images" -runsc "$w/bin/runsc" \
	-out "$OUT/bench.md" >"$OUT/bench.log" 2>&1
echo "exit $?"
sed -n '/^| contender/,/^$/p' "$OUT/bench.md"
echo "--- left on the host"
ls -d /sys/fs/cgroup/agentrun* 2>&1; ls /run | grep -i agentrun
exit $rc
