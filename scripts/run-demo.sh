#!/usr/bin/env bash
# Starts the example backend and the gateway with Caddyfile.example, creates a
# demo key and subscription through the admin API (with the `caddy platform`
# CLI), prints a curl line to try, and stops everything on Ctrl-C.
# Run it through `make run`, which builds bin/caddy and bin/example-backend.
set -euo pipefail
cd "$(dirname "$0")/.."

mkdir -p tmp
# The service secret shared by the gateway and the example backend; kept
# across runs so the demo store stays usable.
if [ ! -s tmp/echo-secret ]; then
	head -c 32 /dev/urandom | base64 | tr -d '/+=\n' | head -c 40 > tmp/echo-secret
fi
export ECHO_SECRET BACKEND_SECRET
ECHO_SECRET=$(cat tmp/echo-secret)
BACKEND_SECRET=$ECHO_SECRET
export PLATFORM_STORE="$PWD/tmp/platform.db"

pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

BACKEND_ADDR=127.0.0.1:9001 bin/example-backend > tmp/backend.log 2>&1 &
pids+=($!)
bin/caddy run --config Caddyfile.example --adapter caddyfile > tmp/caddy.log 2>&1 &
pids+=($!)

# Wait (bounded) for the admin endpoint and the site.
for _ in $(seq 1 50); do
	if curl -fsS -o /dev/null http://localhost:2019/config/ 2>/dev/null; then break; fi
	sleep 0.2
done
if ! curl -fsS -o /dev/null http://localhost:2019/config/; then
	echo "the gateway did not start; see tmp/caddy.log" >&2
	tail -20 tmp/caddy.log >&2
	exit 1
fi

key_json=$(bin/caddy platform key create --user demo-user --roles demo --label "make run" --json)
key=$(printf '%s' "$key_json" | sed -n 's/.*"key": *"\([^"]*\)".*/\1/p')
bin/caddy platform subscribe --user demo-user --service echo --product free --status ACTIVE > /dev/null

url="http://127.0.0.1:8080/api/service/echo/endpoint/hello/invoke?name=you"
echo
echo "The gateway is on http://127.0.0.1:8080 (admin API on localhost:2019)."
echo "Demo service key for user demo-user (shown once, stored only as a hash):"
echo "  $key"
echo
echo "Try it:"
echo "  curl -i -H 'Authorization: Bearer $key' '$url'"
echo
echo "First call:"
curl -sS -H "Authorization: Bearer $key" "$url"
echo
echo "Usage so far:  bin/caddy platform usage --user demo-user"
echo "Logs: tmp/caddy.log, tmp/backend.log. Ctrl-C stops everything."
wait
