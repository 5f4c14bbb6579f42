#!/usr/bin/env bash
# bundle.sh prepares _device/bundle.tar.xz for a run of the test suites on a
# second machine that has no Go and no package access (pure cgroup v2): the
# test binaries, agentrun and its seccomp helper, the bench, runsc, the escape probe, and the
# busybox and a slimmed python root filesystem. test/device/run.sh runs it there.
set -euo pipefail
cd "$(dirname "$0")/../.."
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
images=${AGENTRUN_IMAGES:-/var/cache/agentrun/images}
runsc=$(GO=$GO test/runsc.sh)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/images/python" "$work/images/busybox" _device

export CGO_ENABLED=1
# libseccomp linked statically, as make build does.
libdir=$(pkg-config --variable=libdir libseccomp)
[ -f "$libdir/libseccomp.a" ] || { echo "bundle.sh: $libdir/libseccomp.a missing (libseccomp-dev)" >&2; exit 1; }
export CGO_LDFLAGS="$libdir/libseccomp.a"
flags=(-tags seccomp,runc_nocriu -trimpath -ldflags "-s -w")
"$GO" test -c "${flags[@]}" -o "$work/bin/integration.test" ./test/integration
"$GO" test -c "${flags[@]}" -o "$work/bin/escape.test" ./test/escape
# runtime/cgroup's v2 paths (cgroup.kill, the v2 freeze, memory.peak) run
# only on a v2 host.
"$GO" test -c "${flags[@]}" -o "$work/bin/cgroup.test" ./runtime/cgroup
# The tool broker's fence (a server started straight into its cgroup with
# clone3's CLONE_INTO_CGROUP on v2, in namespaces of its own).
"$GO" test -c "${flags[@]}" -o "$work/bin/toolbroker.test" ./internal/toolbroker
# runtime/runsc's own tests are left out for size: the integration suite
# runs every behavioural test on runsc too.
# agentrun itself static, glibc included, as make build links it.
"$GO" build -tags seccomp,runc_nocriu,osusergo,netgo -trimpath -ldflags "-s -w -linkmode external -extldflags -static" -o "$work/bin/agentrun" ./cmd/agentrun
# Its seccomp helper beside it (and beside the test binaries, which find
# it there as agentrun does), as make build puts it.
make --no-print-directory bin/agentrun-seccomp >&2
install -m 0755 bin/agentrun-seccomp "$work/bin/agentrun-seccomp"
"$GO" build "${flags[@]}" -o "$work/bin/bench" ./test/bench
CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w" -o "$work/bin/probe" ./test/escape/probe
cp "$runsc" "$work/bin/runsc"
# The workers' tests start nats-server (Debian's, linked against libc only).
cp "$(command -v nats-server || echo /usr/sbin/nats-server)" "$work/bin/nats-server"
# The sandbox's init (Debian's tini), for a machine without apt.
cp /usr/bin/tini-static "$work/bin/tini-static"

cp -a "$images/busybox/rootfs" "$work/images/busybox/rootfs"
cp -a "$images/busybox/oci" "$work/images/busybox/oci"
# The python image without what no test uses (docs, locales, perl, bytecode
# caches, unused modules and libraries), to fit the carry limit.
py=$work/images/python/rootfs
cp -a "$images/python/rootfs" "$py"
find "$py" -name __pycache__ -type d -prune -exec rm -rf {} +
rm -rf "$py"/usr/share/* "$py"/var/lib/dpkg "$py"/var/cache "$py"/var/log "$py"/usr/lib/apt \
	"$py"/usr/bin/perl* "$py"/usr/lib/x86_64-linux-gnu/perl* "$py"/usr/lib/x86_64-linux-gnu/gconv \
	"$py"/usr/lib/python3.11/{test,ensurepip,idlelib,lib2to3,pydoc_data,tkinter,turtledemo,asyncio,multiprocessing,unittest,xml,sqlite3,distutils} \
	"$py"/usr/lib/python3.11/config-3.11-x86_64-linux-gnu
chroot "$py" python3 -c "import urllib.request, ssl, json, ctypes, threading, platform, socket, errno" ||
	{ echo "bundle.sh: the slimmed python image is broken" >&2; exit 1; }

tar -C "$work" -cf - . | xz -9 -T2 >_device/bundle.tar.xz.new
mv _device/bundle.tar.xz.new _device/bundle.tar.xz
cp test/device/run.sh _device/run.sh
size=$(stat -c %s _device/bundle.tar.xz)
echo "bundle.sh: _device/bundle.tar.xz is $((size >> 20)) MiB"
[ "$size" -lt $((62 << 20)) ] || { echo "bundle.sh: over the 62 MiB carry budget" >&2; exit 1; }
