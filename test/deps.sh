#!/usr/bin/env bash
# deps.sh installs the Debian packages agentrun's build, demo and tests need,
# when any is missing (systemd: systemd-analyze and systemd-socket-activate
# for the unit tests; mmdebstrap: the Debian root the package installs into;
# chromium: the headless browser the approvals page is tested in;
# python3 and python3-venv: the Python client's tests, and its install in a
# fresh venv (pip from the venv's ensurepip, nothing else); python3-mypy:
# the client's type check, make lint-python-client;
# pyflakes3: the lint of the Python launcher, make lint-launcher;
# tmux: the terminal `agentrun shell` is tested in; musl-tools: the
# seccomp helper is built against musl, Makefile HELPER_CC).
# Node.js and npm (the MCP test client) count as present when their commands
# are, whichever package brought them: a host's own Node.js build (such as
# nodesource's, which ships npm inside and conflicts with Debian's npm) is
# kept. Needs root; a no-op when all are present.
set -euo pipefail
pkgs=(gcc make libc6-dev musl-tools pkg-config libseccomp-dev busybox-static mmdebstrap ca-certificates runc bubblewrap docker-registry iproute2 skopeo umoci time nats-server systemd tini e2fsprogs chromium python3 python3-venv python3-mypy pyflakes3 tmux)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
command -v node >/dev/null && command -v npm >/dev/null || missing+=(nodejs npm)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
	echo "deps.sh: missing packages ${missing[*]}; run as root or apt-get install them" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
