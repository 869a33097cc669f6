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

# The ports the demo listens on (Caddyfile.example and the examples).
# Test hooks, for scripts/demo_test.go, which runs this script with
# stand-in binaries: DEMO_PORTS replaces the list of ports checked below,
# DEMO_CHECK_URL the address of every readiness check and of the first call.
ports=${DEMO_PORTS-2019 8080 9001 9002 9003}
at() { printf '%s' "${DEMO_CHECK_URL:-$1}"; }

# fail prints its message and the last lines of a log on stderr and stops.
fail() {
	echo "run-demo: $1" >&2
	if [ -n "${2:-}" ] && [ -s "$2" ]; then
		echo "--- last lines of $2:" >&2
		tail -n 20 "$2" >&2
		echo "---" >&2
	fi
	exit 1
}

# Any of our ports taken means another server (an earlier demo, a foreign
# service) would answer instead of ours: the demo would look fine while
# proxying to something else. Refuse before starting anything.
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
busy=()
for p in $ports; do
	if listening "$p"; then busy+=("$p"); fi
done
if [ ${#busy[@]} -gt 0 ]; then
	msg="port(s) ${busy[*]} on 127.0.0.1 already in use; the demo needs ${ports// /, } free."
	msg+=" Stop what listens there (an earlier 'make run'?); see: ss -ltnp | grep -E ':(${ports// /|})\b'"
	fail "$msg"
fi

pids=()
names=()
logs=()
cleanup() {
	# SIGTERM: the examples finish what they are doing and stop.
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

# start NAME LOG CMD...: runs CMD in the background, output to LOG.
start() {
	local name=$1 log=$2
	shift 2
	"$@" > "$log" 2>&1 &
	pids+=($!)
	names+=("$name")
	logs+=("$log")
}

# alive fails loudly when a started process has exited (it could not
# listen, a bad secret, a crash): its port may be answered by nobody, or by
# someone else.
alive() {
	local i
	for i in "${!pids[@]}"; do
		if ! kill -0 "${pids[$i]}" 2>/dev/null; then
			local rc=0
			wait "${pids[$i]}" 2>/dev/null || rc=$?
			fail "${names[$i]} exited (status $rc) right after starting." "${logs[$i]}"
		fi
	done
}

start examples/backend tmp/backend.log \
	env BACKEND_SECRET="$ECHO_SECRET" BACKEND_ADDR=127.0.0.1:9001 bin/example-backend
start examples/asyncbackend tmp/asyncbackend.log \
	env BACKEND_SECRET="$JOBS_SECRET" BACKEND_ADDR=127.0.0.1:9002 RECONCILIATION_LOG=tmp/jobs-reconciliation.jsonl \
	bin/example-asyncbackend
start examples/reporter tmp/reporter.log \
	env BACKEND_SECRET="$WORDCOUNT_SECRET" BACKEND_ADDR=127.0.0.1:9003 RECONCILIATION_LOG=tmp/wordcount-reconciliation.jsonl \
	bin/example-reporter
# The operator console behind basic_auth (Caddyfile.example): a password
# of this demo's own, kept across runs like the secrets, and its bcrypt hash
# for the Caddyfile.
export CONSOLE_USER=operator CONSOLE_PASSWORD_HASH
console_password=$(secret console)
CONSOLE_PASSWORD_HASH=$(bin/caddy hash-password --plaintext "$console_password") ||
	fail "bin/caddy hash-password failed; the console needs a password hash."

start "the gateway (bin/caddy)" tmp/caddy.log \
	bin/caddy run --config Caddyfile.example --adapter caddyfile

# Wait (bounded, 10 s) for the admin endpoint and every backend, checking
# on each round that every process is still running: an answer on a port
# is ours only while our process lives.
up() { curl -sS -o /dev/null "$(at "$1")" 2>/dev/null; }
all_up() {
	up http://localhost:2019/config/ && up http://127.0.0.1:9001/ && up http://127.0.0.1:9002/ && up http://127.0.0.1:9003/
}
for _ in $(seq 1 50); do
	alive
	if all_up; then break; fi
	sleep 0.2
done
alive
if ! up http://localhost:2019/config/; then
	fail "the gateway did not answer on its admin endpoint localhost:2019 within 10 s." tmp/caddy.log
fi
for b in backend:9001 asyncbackend:9002 reporter:9003; do
	if ! up "http://127.0.0.1:${b#*:}/"; then
		fail "examples/${b%:*} did not answer on 127.0.0.1:${b#*:} within 10 s." "tmp/${b%:*}.log"
	fi
done

# The previous run's demo key still works (the store is kept across runs):
# revoke it, so only the key printed below is live.
if [ -s tmp/demo-key-id ]; then
	old=$(cat tmp/demo-key-id)
	if bin/caddy platform key revoke "$old" > /dev/null 2> tmp/revoke.err; then
		echo "Revoked the previous demo key $old."
	elif ! grep -q 'HTTP 404' tmp/revoke.err; then
		fail "could not revoke the previous demo key $old:" tmp/revoke.err
	fi
	rm -f tmp/demo-key-id tmp/revoke.err
fi

key_json=$(bin/caddy platform key create --user demo-user --roles demo --label "make run" --json)
key=$(printf '%s' "$key_json" | sed -n 's/.*"key": *"\([^"]*\)".*/\1/p')
key_id=$(printf '%s' "$key_json" | sed -n 's/.*"keyId": *"\([^"]*\)".*/\1/p')
[ -n "$key" ] && [ -n "$key_id" ] || fail "could not create the demo key: $key_json"
printf '%s\n' "$key_id" > tmp/demo-key-id
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
echo "The caller portal: $gw/portal/ (sign in with this key to see demo-user's"
echo "subscriptions, usage, jobs and keys; docs/portal.md)."
echo
echo "The storefront: $gw/store/ (the public services echo and jobs, their plans"
echo "and docs; docs/storefront.md). The public catalog's JSON: $gw/catalog/services"
echo
echo "Try it (sync, examples/backend):"
echo "  curl -i -H '$auth' '$url'"
echo
echo "An async job (examples/asyncbackend): start it, then poll the progressUrl"
echo "it answers with (.../requests/<requestId>/status), and fetch the result"
echo "(swap /status for /result):"
echo "  curl -H '$auth' -d 'make this loud' $gw/api/service/jobs/endpoint/upper/invoke/async"
echo "  curl -H '$auth' $gw/api/requests/<requestId>/status"
echo
echo "A backend called directly, which validates the key and reports its own"
echo "usage (examples/reporter):"
echo "  curl -H '$auth' -d 'count these words please' http://127.0.0.1:9003/count"
echo
echo "First call:"
# curl exits 0 on any HTTP status: an error status (401, 502, ...) must
# fail the script too, with the answer printed. (Not --fail-with-body: curl
# before 7.76, as on Debian 11 or RHEL 8, does not know it.)
status=$(curl -sS -o tmp/first-call.out -w '%{http_code}' -H "$auth" "$(at "$url")") ||
	fail "the first call through the gateway failed; see tmp/caddy.log" tmp/caddy.log
cat tmp/first-call.out
case $status in
2??) ;;
*) echo; fail "the first call through the gateway failed (HTTP $status); see tmp/caddy.log" tmp/caddy.log ;;
esac
echo
echo "Usage so far:  bin/caddy platform usage --user demo-user"
echo "Operator console (docs/console.md): $gw/console/"
echo "  sign in as $CONSOLE_USER, password $console_password (tmp/console-secret)"
# The {$VAR} placeholders of Caddyfile.example are read by whoever adapts
# it, so the reload line carries each one this run set: without
# CONSOLE_PASSWORD_HASH the reloaded console would fall back to a hash
# nobody knows, and without PLATFORM_STORE the reload is refused.
quote() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
reload_env="PLATFORM_STORE=$(quote "$PLATFORM_STORE") CONSOLE_USER=$(quote "$CONSOLE_USER")"
reload_env+=" CONSOLE_PASSWORD_HASH=$(quote "$CONSOLE_PASSWORD_HASH")"
echo "Reload after editing Caddyfile.example (with the settings of this run):"
echo "  $reload_env bin/caddy reload --config Caddyfile.example --adapter caddyfile"
echo "Logs: tmp/caddy.log, tmp/backend.log, tmp/asyncbackend.log, tmp/reporter.log;"
echo "reconciliation logs: tmp/jobs-reconciliation.jsonl, tmp/wordcount-reconciliation.jsonl."
echo "Ctrl-C stops everything."
wait
