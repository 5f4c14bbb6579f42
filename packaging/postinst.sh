#!/bin/sh
# postinst: the agentrun group (access to the API socket), the state
# directories, and the socket enabled when systemd runs.
set -e
if ! getent group agentrun >/dev/null; then
	groupadd --system agentrun
fi
install -d -m 0755 /var/lib/agentrun /var/lib/agentrun/results
install -d -m 0750 /var/log/agentrun
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
	systemctl enable agentrun.socket >/dev/null || true
	systemctl start agentrun.socket || true
fi
exit 0
