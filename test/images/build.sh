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
#
# Builds of one image never meet: each holds the image's lock ($out/.NAME.lock,
# flock(1)) from its look at the stamp to the image's rename, so a second
# build waits for the first and then finds the image fresh. An image is made
# in a private directory beside it ($out/.NAME.new.*, the same file system)
# and renamed into place, the old one aside first and then removed: a build
# that fails or is killed leaves no half-made image under NAME, and the next
# build of NAME removes what it left.
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

# building is the new directory of the build under way, removed if the
# build fails.
building=
trap '[ -z "$building" ] || rm -rf "$building"' EXIT

# build NAME builds image NAME into $out/NAME, unless it is fresh, under
# its lock: build_NAME makes it in a new directory, which is stamped and
# renamed into place.
build() {
	local name=$1 dir=$out/$1 lock old
	exec {lock}>"$out/.$name.lock"
	if ! flock -n "$lock"; then
		echo "build.sh: waiting for another build of $name" >&2
		flock -w 3600 "$lock" || { echo "build.sh: another build of $name held its lock for an hour" >&2; exit 1; }
	fi
	if ! fresh "$dir"; then
		rm -rf "$out/.$name".new.* "$out/.$name".old.*
		building=$(mktemp -d "$out/.$name.new.XXXXXX")
		chmod 0755 "$building"
		# The lock is not the build's programs' to hold (one that lived on
		# would hold it past the build).
		"build_${name//-/_}" "$building" {lock}>&-
		stamp_of "$name" >"$building/.stamp"
		if [ -e "$dir" ]; then
			old=$(mktemp -d "$out/.$name.old.XXXXXX")
			mv -T "$dir" "$old"
			mv -T "$building" "$dir"
			rm -rf "$old"
		else
			mv -T "$building" "$dir"
		fi
		building=
	fi
	exec {lock}>&-
}

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

# build_busybox DIR makes the busybox image in DIR.
build_busybox() {
	local dir=$1
	need busybox busybox-static
	local bb
	bb=$(command -v busybox)
	mkdir -p "$dir/rootfs"/{bin,etc}
	cp "$(readlink -f "$bb")" "$dir/rootfs/bin/busybox"
	for applet in $("$bb" --list); do
		[ "$applet" = busybox ] || ln -sf busybox "$dir/rootfs/bin/$applet"
	done
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$dir/rootfs/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$dir/rootfs/etc/group"
	finish "$dir/rootfs"
	pack "$dir"
}

# pack writes DIR/oci, an OCI layout of DIR/rootfs tagged latest.
pack() {
	(cd "$here/../.." && CGO_ENABLED=0 "$GO" run ./test/images/ocipack "$1/rootfs" "$1/oci" latest)
}

# debian DIR PACKAGES makes in DIR an image of Debian's "essential"
# variant plus PACKAGES (comma-separated), docs stripped.
debian() {
	local dir=$1
	need mmdebstrap mmdebstrap
	mmdebstrap --quiet --variant=essential --include="$2" \
		--dpkgopt='path-exclude=/usr/share/man/*' \
		--dpkgopt='path-exclude=/usr/share/doc/*' \
		--dpkgopt='path-exclude=/usr/share/locale/*' \
		--dpkgopt='path-exclude=/usr/share/info/*' \
		--customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
		"$suite" "$dir/rootfs"
	# A root without Debian's own tools is no image: never stamp one.
	[ -x "$dir/rootfs/usr/bin/dpkg" ] || { echo "build.sh: mmdebstrap left no Debian root in $dir" >&2; exit 1; }
	finish "$dir/rootfs"
	pack "$dir"
}

# python3 with its full standard library, no pip.
build_python() { debian "$1" python3; }

# python's, plus numpy and pandas, the heavy imports a warm pool preloads,
# and matplotlib, whose figures a run shows (spec §12).
build_python_data() { debian "$1" python3,python3-numpy,python3-pandas,python3-matplotlib; }

mkdir -p "$out"
case ${1:-all} in
busybox | python | python-data) build "$1" ;;
all) build busybox && build python ;;
*) echo "usage: $0 [busybox|python|python-data|all]" >&2; exit 2 ;;
esac
echo "$out"
