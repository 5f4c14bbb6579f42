#!/usr/bin/env bash
# runsc.sh installs gVisor's runsc at the version agentrun is tested with,
# when it is missing or of another version, and prints the binary's path.
# The cache dir is /var/cache/agentrun/bin unless $AGENTRUN_RUNSC_DIR is set.
# runsc must be built with cgo off: a cgo build fails at sandbox boot.
set -euo pipefail
version=v0.0.0-20260905035102-160fafc42237
dir=${AGENTRUN_RUNSC_DIR:-/var/cache/agentrun/bin}
bin=$dir/runsc
stamp=$dir/runsc.version
if [ -x "$bin" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version" ]; then
	echo "$bin"
	exit 0
fi
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[ -x "$GO" ] || { echo "runsc.sh: go not found (set GO or PATH)" >&2; exit 1; }
mkdir -p "$dir"
rm -f "$stamp"
echo "runsc.sh: building runsc $version into $dir (takes minutes)" >&2
CGO_ENABLED=0 GOBIN="$dir" "$GO" install "gvisor.dev/gvisor/runsc@$version"
[ -x "$bin" ] || { echo "runsc.sh: go install did not produce $bin" >&2; exit 1; }
echo "$version" >"$stamp"
echo "$bin"
