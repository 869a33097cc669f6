#!/usr/bin/env bash
# Checks contrib/systemd/platform-gateway.service with systemd-analyze
# verify (syntax, known options, the ExecStart binary). The unit names
# /usr/local/bin/caddy; the check points it at a stand-in executable, so it
# runs without installing anything. Installs systemd (for systemd-analyze)
# with apt-get when it is missing and apt-get is there; otherwise says why
# it skips.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v systemd-analyze >/dev/null 2>&1; then
	if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
		echo "systemd-analyze missing: installing the systemd package"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null ||
			{ apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null; }
	fi
fi
if ! command -v systemd-analyze >/dev/null 2>&1; then
	echo "SKIP systemd unit check: systemd-analyze is not installed and could not be (no apt-get or not root)"
	exit 0
fi

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
printf '#!/bin/sh\nexit 0\n' > "$dir/caddy"
chmod +x "$dir/caddy"
sed "s#/usr/local/bin/caddy#$dir/caddy#g" contrib/systemd/platform-gateway.service > "$dir/platform-gateway.service"
# verify prints problems and may exit 0 on warnings: any output fails.
out=$(systemd-analyze verify "$dir/platform-gateway.service" 2>&1) || { echo "$out"; exit 1; }
if [ -n "$out" ]; then
	echo "systemd-analyze verify contrib/systemd/platform-gateway.service:"
	echo "$out"
	exit 1
fi
echo "systemd unit check passed: contrib/systemd/platform-gateway.service (systemd-analyze verify)"
