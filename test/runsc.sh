#!/usr/bin/env bash
# runsc.sh installs gVisor's runsc at the version agentrun is tested with,
# when it is missing or of another version, and prints the binary's path.
# The cache dir is /var/cache/agentrun/bin unless $AGENTRUN_RUNSC_DIR is set.
# runsc must be built with cgo off: a cgo build fails at sandbox boot.
set -euo pipefail
version=v0.0.0-20260905035102-160fafc42237
# The stamp names the build too: a runsc built another way (without
# precompiled seccomp programs, or with its symbols and debug info) is
# rebuilt.
build="precompiled-seccomp stripped"
dir=${AGENTRUN_RUNSC_DIR:-/var/cache/agentrun/bin}
bin=$dir/runsc
stamp=$dir/runsc.version
if [ -x "$bin" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version $build" ]; then
	echo "$bin"
	exit 0
fi
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[ -x "$GO" ] || { echo "runsc.sh: go not found (set GO or PATH)" >&2; exit 1; }
mkdir -p "$dir"
rm -f "$stamp"
echo "runsc.sh: building runsc $version into $dir (takes minutes)" >&2
# runsc is built from a copy of gVisor's module with its seccomp programs
# precompiled, as gVisor's own build does (test/runsc-precompile).
here=$(cd "$(dirname "$0")" && pwd)
src=$(mktemp -d)
trap 'chmod -R u+w "$src" 2>/dev/null; rm -rf "$src" "$bin.new"' EXIT
mod=$(cd "$src" && "$GO" mod download -json "gvisor.dev/gvisor@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$mod" ] || { echo "runsc.sh: go mod download gvisor.dev/gvisor@$version gave no directory" >&2; exit 1; }
cp -r "$mod" "$src/gvisor"
chmod -R u+w "$src/gvisor"
mkdir "$src/gvisor/agentrun-precompile"
sed '/^\/\/go:build ignore$/d' "$here/runsc-precompile/main.go" >"$src/gvisor/agentrun-precompile/main.go"
(cd "$src/gvisor" && CGO_ENABLED=0 "$GO" run ./agentrun-precompile -gvisor . && CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w" -o "$bin.new" ./runsc)
mv "$bin.new" "$bin"
[ -x "$bin" ] || { echo "runsc.sh: the build did not produce $bin" >&2; exit 1; }
echo "$version $build" >"$stamp"
echo "$bin"
