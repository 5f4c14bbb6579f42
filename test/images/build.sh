#!/usr/bin/env bash
# build.sh builds the root filesystems agentrun's tests and demo run, from
# Debian packages only (no container registry is needed), and caches them.
#
#   test/images/build.sh [busybox|python|python-data|all]
#
# Output (under $AGENTRUN_IMAGES, default /var/cache/agentrun/images):
#   busybox/rootfs      busybox-static with its applets, /etc/passwd with nobody
#   python/rootfs       Debian bookworm "essential" + python3, docs stripped
#   python-data/rootfs  python's, plus Debian's numpy, pandas and matplotlib
#                       (for warm pools' preloads, figures and make bench;
#                       not in "all": the tests that need it build it)
#   */oci               each rootfs packed as an OCI image layout, tag "latest"
# A rootfs is rebuilt only when its recipe changes: its stamp is the hash of
# its build function, the helpers and the packer, so adding an image does not
# rebuild the others.
set -euo pipefail

out=${AGENTRUN_IMAGES:-/var/cache/agentrun/images}
suite=${AGENTRUN_SUITE:-bookworm}
here=$(cd "$(dirname "$0")" && pwd)
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}

need() { command -v "$1" >/dev/null || { echo "build.sh: $1 not found; install $2 (apt-get install $2)" >&2; exit 1; }; }

# stamp_of NAME is the stamp of image NAME's recipe.
stamp_of() {
	{ declare -f "build_${1//-/_}" finish pack debian; cat "$here"/ocipack/main.go; } | sha256sum | cut -c1-16 | tr -d '\n'
	echo "-$suite"
}

fresh() { [ -f "$1/.stamp" ] && [ "$(cat "$1/.stamp")" = "$(stamp_of "$(basename "$1")")" ]; }

# finish adds the mount points every sandbox needs.
finish() {
	local root=$1
	mkdir -p "$root"/{proc,sys,dev,tmp,workspace,etc}
	chmod 1777 "$root/tmp"
	for f in resolv.conf hosts; do
		rm -f "$root/etc/$f"
		: >"$root/etc/$f"
		chmod 0644 "$root/etc/$f"
	done
}

build_busybox() {
	local dir=$out/busybox
	fresh "$dir" && return 0
	need busybox busybox-static
	local bb
	bb=$(command -v busybox)
	rm -rf "$dir.new"
	mkdir -p "$dir.new/rootfs"/{bin,etc}
	cp "$(readlink -f "$bb")" "$dir.new/rootfs/bin/busybox"
	for applet in $("$bb" --list); do
		[ "$applet" = busybox ] || ln -sf busybox "$dir.new/rootfs/bin/$applet"
	done
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$dir.new/rootfs/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$dir.new/rootfs/etc/group"
	finish "$dir.new/rootfs"
	pack "$dir.new"
	stamp_of busybox >"$dir.new/.stamp"
	rm -rf "$dir" && mv "$dir.new" "$dir"
}

# pack writes DIR/oci, an OCI layout of DIR/rootfs tagged latest.
pack() {
	(cd "$here/../.." && CGO_ENABLED=0 "$GO" run ./test/images/ocipack "$1/rootfs" "$1/oci" latest)
}

# debian NAME PACKAGES builds image NAME: Debian's "essential" variant
# plus PACKAGES (comma-separated), docs stripped.
debian() {
	local dir=$out/$1
	fresh "$dir" && return 0
	need mmdebstrap mmdebstrap
	rm -rf "$dir.new"
	mkdir -p "$dir.new"
	mmdebstrap --quiet --variant=essential --include="$2" \
		--dpkgopt='path-exclude=/usr/share/man/*' \
		--dpkgopt='path-exclude=/usr/share/doc/*' \
		--dpkgopt='path-exclude=/usr/share/locale/*' \
		--dpkgopt='path-exclude=/usr/share/info/*' \
		--customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
		"$suite" "$dir.new/rootfs"
	finish "$dir.new/rootfs"
	pack "$dir.new"
	stamp_of "$1" >"$dir.new/.stamp"
	rm -rf "$dir" && mv "$dir.new" "$dir"
}

# python3 with its full standard library, no pip.
build_python() { debian python python3; }

# python's, plus numpy and pandas, the heavy imports a warm pool preloads,
# and matplotlib, whose figures a run shows (spec §12).
build_python_data() { debian python-data python3,python3-numpy,python3-pandas,python3-matplotlib; }

mkdir -p "$out"
case ${1:-all} in
busybox) build_busybox ;;
python) build_python ;;
python-data) build_python_data ;;
all) build_busybox && build_python ;;
*) echo "usage: $0 [busybox|python|python-data|all]" >&2; exit 2 ;;
esac
echo "$out"
