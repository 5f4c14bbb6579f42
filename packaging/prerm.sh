#!/bin/sh
# prerm: stop the service and its socket when the package is removed.
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
	systemctl stop agentrun.socket agentrun.service agentrun-worker.service >/dev/null 2>&1 || true
	systemctl disable agentrun.socket >/dev/null 2>&1 || true
fi
exit 0
