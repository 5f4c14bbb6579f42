#!/usr/bin/env bash
# deb.sh BIN HELPER OUTDIR VERSION: builds the Debian package of agentrun
# from the binary BIN and its seccomp helper HELPER with nfpm (run with go run at a pinned version) into OUTDIR,
# and prints the package's path.
set -euo pipefail
[ $# -eq 4 ] || { echo "usage: deb.sh BIN HELPER OUTDIR VERSION" >&2; exit 2; }
nfpm=github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
cd "$(dirname "$0")/.."
bin=$(realpath "$1")
helper=$(realpath "$2")
mkdir -p "$3"
out=$(realpath "$3")
arch=$(dpkg --print-architecture 2>/dev/null || "$GO" env GOARCH)
pkg=$out/agentrun_$4_$arch.deb
rm -f "$pkg"
# nfpm expands the environment in some fields only: the binaries' paths
# are put in by hand.
conf=$(mktemp)
trap 'rm -f "$conf"' EXIT
sed -e "s|\${BIN}|$bin|" -e "s|\${HELPER}|$helper|" packaging/nfpm.yaml >"$conf"
VERSION=$4 ARCH=$arch CGO_ENABLED=0 CGO_LDFLAGS= \
	"$GO" run "$nfpm" package --config "$conf" --packager deb --target "$pkg" >&2
echo "$pkg"
