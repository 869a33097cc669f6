#!/usr/bin/env bash
# make test: go test -race on every package, one package at a time, saying
# which package is running before it starts (the end-to-end packages take
# minutes, and `go test ./...` prints nothing until a package ends). The
# lines go test prints are kept as they are (`ok`, `FAIL`, `?`), which
# .ci/run counts. Runs every package even after a failure, then fails.
#
# -p 1 semantics: the in-process Caddy servers of different packages share
# the admin port (caddytest), so packages run one after another.
#
#   GO        the go command (default go)
#   TESTFLAGS extra flags for go test, e.g. TESTFLAGS='-run TestCLI'
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

pkgs=$($GO list ./...) || exit 1
total=$(printf '%s\n' "$pkgs" | wc -l)
n=0
failed=()
start=$SECONDS
for pkg in $pkgs; do
	n=$((n + 1))
	echo "=== [$n/$total] $pkg ($((SECONDS - start))s elapsed)"
	# shellcheck disable=SC2086
	if ! $GO test -race -count=1 -timeout 30m ${TESTFLAGS:-} "$pkg"; then
		failed+=("$pkg")
	fi
done
# The allocation budget of a sync call (docs/performance.md): without
# -race, which drops sync.Pool items at random and so changes the counts.
echo "=== allocation budget (platformgw TestChainAllocBudget, no -race)"
if ! $GO test -count=1 -run '^TestChainAllocBudget$' ./internal/platformgw; then
	failed+=("allocation budget")
fi
if [ ${#failed[@]} -gt 0 ]; then
	echo "make test: ${#failed[@]} of $total packages failed: ${failed[*]}"
	exit 1
fi
echo "all $total packages passed in $((SECONDS - start))s"
