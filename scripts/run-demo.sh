#!/usr/bin/env bash
# Starts the three example backends and the gateway with Caddyfile.example,
# creates a demo key and subscriptions through the admin API (with the
# `caddy platform` CLI), prints curl lines to try, and stops everything on
# Ctrl-C.
#
#   examples/backend       service echo, sync, on 127.0.0.1:9001
#   examples/asyncbackend  service jobs, async, on 127.0.0.1:9002
#   examples/reporter      service wordcount, called directly, on 127.0.0.1:9003
#
# Run it through `make run`, which builds bin/caddy and the bin/example-*
# binaries.
set -euo pipefail
cd "$(dirname "$0")/.."

mkdir -p tmp
# Each service's secret, shared by the gateway and its backend; kept across
# runs so the demo store stays usable.
secret() {
	local file="tmp/$1-secret"
	if [ ! -s "$file" ]; then
		head -c 32 /dev/urandom | base64 | tr -d '/+=\n' | head -c 40 > "$file"
	fi
	cat "$file"
}
export ECHO_SECRET JOBS_SECRET WORDCOUNT_SECRET
ECHO_SECRET=$(secret echo)
JOBS_SECRET=$(secret jobs)
WORDCOUNT_SECRET=$(secret wordcount)
export PLATFORM_STORE="$PWD/tmp/platform.db"

pids=()
cleanup() {
	# SIGTERM: the examples finish what they are doing and stop.
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

BACKEND_SECRET=$ECHO_SECRET BACKEND_ADDR=127.0.0.1:9001 \
	bin/example-backend > tmp/backend.log 2>&1 &
pids+=($!)
BACKEND_SECRET=$JOBS_SECRET BACKEND_ADDR=127.0.0.1:9002 RECONCILIATION_LOG=tmp/jobs-reconciliation.jsonl \
	bin/example-asyncbackend > tmp/asyncbackend.log 2>&1 &
pids+=($!)
BACKEND_SECRET=$WORDCOUNT_SECRET BACKEND_ADDR=127.0.0.1:9003 RECONCILIATION_LOG=tmp/wordcount-reconciliation.jsonl \
	bin/example-reporter > tmp/reporter.log 2>&1 &
pids+=($!)
bin/caddy run --config Caddyfile.example --adapter caddyfile > tmp/caddy.log 2>&1 &
pids+=($!)

# Wait (bounded) for the admin endpoint and every backend: any HTTP answer
# means it is listening.
up() { curl -sS -o /dev/null "$1" 2>/dev/null; }
for _ in $(seq 1 50); do
	if up http://localhost:2019/config/ && up http://127.0.0.1:9001/ && up http://127.0.0.1:9002/ && up http://127.0.0.1:9003/; then break; fi
	sleep 0.2
done
if ! up http://localhost:2019/config/; then
	echo "the gateway did not start; see tmp/caddy.log" >&2
	tail -20 tmp/caddy.log >&2
	exit 1
fi
for b in backend:9001 asyncbackend:9002 reporter:9003; do
	if ! up "http://127.0.0.1:${b#*:}/"; then
		echo "examples/${b%:*} did not start; see tmp/${b%:*}.log" >&2
		tail -20 "tmp/${b%:*}.log" >&2
		exit 1
	fi
done

key_json=$(bin/caddy platform key create --user demo-user --roles demo --label "make run" --json)
key=$(printf '%s' "$key_json" | sed -n 's/.*"key": *"\([^"]*\)".*/\1/p')
bin/caddy platform subscribe --user demo-user --service echo --product free --status ACTIVE > /dev/null
bin/caddy platform subscribe --user demo-user --service jobs --product words --status ACTIVE > /dev/null
bin/caddy platform subscribe --user demo-user --service wordcount --product words --status ACTIVE > /dev/null

gw=http://127.0.0.1:8080
url="$gw/api/service/echo/endpoint/hello/invoke?name=you"
auth="Authorization: Bearer $key"
echo
echo "The gateway is on $gw (admin API on localhost:2019)."
echo "Demo service key for user demo-user (shown once, stored only as a hash):"
echo "  $key"
echo
echo "Try it (sync, examples/backend):"
echo "  curl -i -H '$auth' '$url'"
echo
echo "An async job (examples/asyncbackend): start it, then poll the status URL"
echo "it answers with, and fetch the result (swap /status for /result):"
echo "  curl -H '$auth' -d 'make this loud' $gw/api/service/jobs/endpoint/upper/invoke/async"
echo "  curl -H '$auth' $gw/api/requests/<requestId>/status"
echo
echo "A backend called directly, which validates the key and reports its own"
echo "usage (examples/reporter):"
echo "  curl -H '$auth' -d 'count these words please' http://127.0.0.1:9003/count"
echo
echo "First call:"
curl -sS -H "$auth" "$url"
echo
echo "Usage so far:  bin/caddy platform usage --user demo-user"
echo "Reload after editing Caddyfile.example (the store path must stay the same):"
echo "  PLATFORM_STORE=$PLATFORM_STORE bin/caddy reload --config Caddyfile.example --adapter caddyfile"
echo "Logs: tmp/caddy.log, tmp/backend.log, tmp/asyncbackend.log, tmp/reporter.log;"
echo "reconciliation logs: tmp/jobs-reconciliation.jsonl, tmp/wordcount-reconciliation.jsonl."
echo "Ctrl-C stops everything."
wait
