#!/usr/bin/env bash
# make test: go test -race on every package with tests, one package at a
# time, saying which package is running before it starts (the end-to-end
# packages take minutes, and `go test ./...` prints nothing until a package
# ends). The lines go test prints are kept as they are (`ok`, `FAIL`).
# Runs every package even after a failure, then fails. Its last line is
# the count, alone: "N passed, M failed" (.ci/run repeats it).
#
# -p 1 semantics: the in-process Caddy servers of different packages share
# the admin port (caddytest), so packages run one after another.
#
# What it leaves out, to be quicker: packages without test files (go vet,
# which make test runs first, has compiled them), and anything under tmp/
# (make run's scratch directory: a Go file left there is not a package of
# the gateway). The first run compiles every dependency (Caddy, pgx,
# chromedp, …) under -race, which is minutes on a small machine before the
# first package's tests start; later runs take them from Go's build cache.
# make test-quick is the fast variant: no -race, and unchanged packages'
# results come from the test cache.
#
#   GO        the go command (default go)
#   TESTFLAGS extra flags for go test, e.g. TESTFLAGS='-run TestCLI'
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

mod=$($GO list -m) || exit 1
# Each package with tests; -e: a broken file elsewhere (tmp/) must not
# stop the listing.
pkgs=$($GO list -e -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./... |
	grep -v -e "^$mod/tmp\$" -e "^$mod/tmp/") || exit 1
total=$(printf '%s\n' "$pkgs" | wc -l)
n=0
passed=0
failed=()
start=$SECONDS
for pkg in $pkgs; do
	n=$((n + 1))
	echo "=== [$n/$total] $pkg ($((SECONDS - start))s elapsed)"
	# shellcheck disable=SC2086
	if $GO test -race -count=1 -timeout 30m ${TESTFLAGS:-} "$pkg"; then
		passed=$((passed + 1))
	else
		failed+=("$pkg")
	fi
done
# The allocation budget of a sync call (docs/performance.md): without
# -race, which drops sync.Pool items at random and so changes the counts.
echo "=== allocation budget (platformgw TestChainAllocBudget, no -race)"
if $GO test -count=1 -run '^TestChainAllocBudget$' ./internal/platformgw; then
	passed=$((passed + 1))
else
	failed+=("allocation budget")
fi
echo "make test: $total packages and the allocation budget in $((SECONDS - start))s${failed[*]:+; failed: ${failed[*]}}"
echo "$passed passed, ${#failed[@]} failed"
[ ${#failed[@]} -eq 0 ]
