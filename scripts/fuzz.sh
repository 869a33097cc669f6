#!/usr/bin/env bash
# Runs every fuzz target for a short, bounded time (make fuzz; CI runs it
# after make test). The committed seed corpora (<package>/testdata/fuzz/)
# already run as plain tests in make test; this adds FUZZTIME of new inputs
# per target. A failing input is written to <package>/testdata/fuzz/<target>/
# by go test: commit it with the fix, and it stays a regression test.
#
# Settings (environment):
#   FUZZTIME          time per target (default 10s)
#   FUZZ_MINIMIZE     time to minimise a new input (default 2s; Go's 60s
#                     default stalls the Caddyfile target, whose every run
#                     covers all of Caddy's adapter)
#   FUZZ_ONLY         space-separated target names to run only those
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZTIME=${FUZZTIME:-10s}
FUZZ_MINIMIZE=${FUZZ_MINIMIZE:-2s}
GO=${GO:-go}

# package target, one per line: the signature verifiers, the JWT reader, the body parsers
# of the usage service, the path parsers, the Caddyfile and the quantities.
targets="
./internal/signing FuzzVerify
./internal/signing FuzzSignV3
./internal/signing FuzzParseTimestamp
./internal/signing FuzzAppendJSString
./internal/signing FuzzAsyncCanonical
./sdk FuzzVerifierVerify
./internal/servicekey FuzzWellFormed
./internal/jwtauth FuzzUserID
./internal/usagehandler FuzzParseReport
./internal/usagehandler FuzzParseProgress
./internal/usagehandler FuzzParseCompletion
./internal/usagehandler FuzzMatchRoute
./internal/platformgw FuzzParseInvokePath
./internal/platformgw FuzzStripCallerHeaders
./internal/platformgw FuzzAcceptedBody
./internal/store/boltstore FuzzEncodeJob
./internal/platform FuzzCaddyfile
./internal/ops FuzzParseSignedUnits
./internal/billing FuzzParseUnits
"

# Every Fuzz function in the tree must be listed above, so a new target is
# not silently left out of CI.
listed=$(echo "$targets" | awk 'NF {print $2}' | sort)
found=$(grep -rhoE --include='*_test.go' '^func (Fuzz[A-Za-z0-9_]+)\(' . | sed -E 's/^func (Fuzz[A-Za-z0-9_]+)\(/\1/' | sort)
if [ "$listed" != "$found" ]; then
	echo "fuzz targets in the tree and in scripts/fuzz.sh differ:"
	diff <(echo "$listed") <(echo "$found") || true
	exit 1
fi

# fuzz_once runs one target for FUZZTIME, its output in $out.
fuzz_once() {
	$GO test -run '^$' -fuzz "^${2}\$" -fuzztime "$FUZZTIME" \
		-fuzzminimizetime "$FUZZ_MINIMIZE" "$1" >"$out" 2>&1
}

# flaked tells a failure of Go's fuzzing engine itself from a failing
# input: "context deadline exceeded" (a worker that did not answer the
# coordinator in time, seen on a loaded machine) with no new input written
# under testdata/fuzz. That run is retried once; a failing input never is.
flaked() {
	grep -q 'context deadline exceeded' "$out" || return 1
	[ -z "$(git status --porcelain -- "$1/testdata/fuzz/$2" 2>/dev/null)" ] || return 1
	echo "   (Go's fuzzing engine timed out with no failing input; running $2 once more)"
}

failed=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT
while read -r pkg target; do
	[ -z "$pkg" ] && continue
	if [ -n "${FUZZ_ONLY:-}" ] && ! [[ " $FUZZ_ONLY " == *" $target "* ]]; then
		continue
	fi
	echo "== $target ($pkg, $FUZZTIME)"
	if fuzz_once "$pkg" "$target" || { flaked "$pkg" "$target" && fuzz_once "$pkg" "$target"; }; then
		{ grep -E 'execs:' "$out" || tail -n 1 "$out"; } | tail -n 1
	else
		grep -vE '^fuzz: elapsed:.*execs' "$out" || true
		echo "!! $target failed; the input is under $pkg/testdata/fuzz/$target/"
		failed=1
	fi
done <<<"$targets"
exit $failed
