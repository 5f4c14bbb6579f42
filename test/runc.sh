#!/usr/bin/env bash
# runc.sh builds runc's CLI at the libcontainer version agentrun links
# (go.mod), when it is missing, and prints the binary's path: the bench
# measures it beside Debian's runc, the same spec through the same
# libcontainer. The cache dir is /var/cache/agentrun/bin unless
# $AGENTRUN_RUNC_DIR is set. Needs cgo and libseccomp-dev (make deps).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[ -x "$GO" ] || { echo "runc.sh: go not found (set GO or PATH)" >&2; exit 1; }
version=$("$GO" list -m -f '{{.Version}}' github.com/opencontainers/runc)
dir=${AGENTRUN_RUNC_DIR:-/var/cache/agentrun/bin}/runc-$version
bin=$dir/runc
if [ -x "$bin" ]; then
	echo "$bin"
	exit 0
fi
mkdir -p "$dir"
echo "runc.sh: building runc $version into $dir" >&2
CGO_ENABLED=1 GOBIN="$dir" "$GO" install -tags seccomp -ldflags "-X main.version=${version#v}" "github.com/opencontainers/runc@$version"
[ -x "$bin" ] || { echo "runc.sh: go install did not produce $bin" >&2; exit 1; }
echo "$bin"
