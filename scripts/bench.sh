#!/usr/bin/env bash
# The gateway against plain Caddy reverse_proxy, in the same binary and the
# same run (make bench; docs/performance.md explains the method).
#
# One Caddy process serves two sites on loopback: the gateway
# (platform_usage, platform_gateway, reverse_proxy) and a plain
# reverse_proxy, both to the same loopback backend (scripts/bench/backend:
# /instant answers at once, /slow after 5 ms, /job accepts async jobs).
# A service key and a subscription with a quota nobody reaches are created
# through the `caddy platform` CLI. Then rounds alternate every scenario:
#
#   proxy       plain reverse_proxy, instant backend, 64 connections (wrk)
#   sync        sync invoke, same backend and load: key, subscription, rate
#               limit, quota reservation, v3 signing, durable metering
#               (durability sync: each settlement waits for an fdatasync
#               of the settlement log, shared by the calls in flight)
#   proxy-256   plain reverse_proxy at 256 connections (the next row's baseline)
#   sync-256    sync invoke at 256 connections
#   sync-write  sync invoke against a second gateway process with
#               durability write (acknowledged once written; fdatasync
#               every 5 ms), its own store, same backend
#   report-write  usage reports against that process
#   async       async invoke (202): the job stored durably, the envelope
#               forwarded
#   status      GET {gw}/requests/{id}/status with the caller's key
#   report      POST {usage}/report, signed, each durable before its 200
#   proxy-5ms   plain reverse_proxy, 5 ms backend, constant rate of half the
#               round's proxy peak (scripts/bench/loadgen, latency from each
#               request's due time)
#   sync-5ms    sync invoke at that same rate
#   *-5ms-low   both again at half the sync invoke's own peak, which shows
#               the latency a call adds when the gateway is not overloaded,
#               and write-5ms-low: the durability write gateway at that rate
#
# and a table gives the median of the rounds: requests/s, p50, p99, the
# ratio to plain reverse_proxy (peak rows) and the latency the gateway adds
# (5 ms rows), and the CPU time the Caddy process used per request served
# (utime + stime from /proc/<pid>/stat over the measured interval, divided
# by the requests served in it), its difference to plain reverse_proxy's in
# the same round (what the gateway costs) and their ratio. Throughput on a
# shared 2-core machine moves with everything else that runs; CPU per
# request moves much less. Before the rounds, the median time of a 4 KiB
# write + fdatasync next to the store is printed: a settlement acknowledged
# under durability sync waits for one (shared with the calls in flight). Everything runs on loopback and is stopped at the end.
#
# Both sites use the same transport settings, with 128 idle upstream
# connections per host (Caddy's default of 32 makes the proxy close and
# reopen connections at 64 concurrent callers).
#
# Settings (environment): BENCH_ROUNDS (3), BENCH_DURATION (8s per run),
# BENCH_CONNS (64), BENCH_ONLY="sync report ..." to run only some scenarios
# (proxy always runs: everything is compared with it; "write" runs the
# durability write rows, "256" the 256-connection row), BENCH_PROFILE=<dir> to also save CPU profiles of the
# gateway under sync, status, async and report load, of plain reverse_proxy and of the
# durability write gateway, BENCH_PORT_BASE (3410: admin +0,
# gateway +1, proxy +2, backend +3, write-mode admin +4, gateway +5),
# BENCH_IDLE_CONNS (128: idle upstream connections per host, both sites),
# BENCH_CHART (bin/bench/cpu.svg: the CPU per request as a bar chart; empty: none).
# BENCH_GROUP_COMMIT (paced|eager: the gateways' group_commit; empty: the default),
# BENCH_WRITE_FLUSH (the durability write gateway's flush_interval; empty: the default).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${BENCH_ROUNDS:-3}
DURATION=${BENCH_DURATION:-8s}
CONNS=${BENCH_CONNS:-64}
WRITE_FLUSH=${BENCH_WRITE_FLUSH:-}
GROUP_COMMIT=${BENCH_GROUP_COMMIT:-}
PROFILE_DIR=${BENCH_PROFILE:-}
ONLY=${BENCH_ONLY:-sync async status report 5ms write 256}
PORT_BASE=${BENCH_PORT_BASE:-3410}
IDLE_CONNS=${BENCH_IDLE_CONNS:-128}
ADMIN=127.0.0.1:$((PORT_BASE + 0))
GW=http://127.0.0.1:$((PORT_BASE + 1))
PROXY=http://127.0.0.1:$((PORT_BASE + 2))
BACKEND=127.0.0.1:$((PORT_BASE + 3))
ADMIN_W=127.0.0.1:$((PORT_BASE + 4))
GW_W=http://127.0.0.1:$((PORT_BASE + 5))
SECRET=bench-secret-0123456789abcdef0123456789

log() { printf '%s\n' "$*" >&2; }
wanted() { [[ " $ONLY " == *" $1 "* ]]; }

# --- tools -----------------------------------------------------------------
if ! command -v wrk > /dev/null; then
	log "installing wrk (Debian package)"
	if [ "$(id -u)" = 0 ]; then
		apt-get update -qq > /dev/null && apt-get install -y -qq wrk > /dev/null
	else
		sudo apt-get update -qq > /dev/null && sudo apt-get install -y -qq wrk > /dev/null
	fi
fi
mkdir -p bin/bench
CADDY=${BENCH_CADDY:-bin/caddy}
if [ -z "${BENCH_CADDY:-}" ]; then
	go build -o bin/caddy ./caddy
fi
go build -o bin/bench/backend ./scripts/bench/backend
go build -o bin/bench/loadgen ./scripts/bench/loadgen

# --- processes ---------------------------------------------------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/platform-bench.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
	wait 2> /dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bin/bench/backend -addr "$BACKEND" -delay 5ms > "$work/backend.log" 2>&1 &
pids+=($!)

cat > "$work/Caddyfile" << EOF
{
	admin $ADMIN
	http_port $((PORT_BASE + 1))
	auto_https off
	grace_period 1s
	log {
		level WARN
	}
	platform {
		store $work/platform.db${GROUP_COMMIT:+
		group_commit $GROUP_COMMIT}
		service bench {
			backend http://$BACKEND
			secret $SECRET
			endpoint instant {
				methods GET POST
				path /instant
			}
			endpoint slow {
				methods GET POST
				path /slow
			}
			endpoint job {
				methods POST
				path /job
				async
			}
			# A quota and a rate limit that are checked on every call but
			# never reached.
			product bench {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 1000000000000 per month
				overage block
				rate_limit 10000000/s burst 10000000
			}
		}
	}
}

http://127.0.0.1:$((PORT_BASE + 1)) {
	platform_usage
	platform_gateway
	reverse_proxy {
		dynamic platform
		transport platform {
			keepalive_idle_conns_per_host $IDLE_CONNS
		}
	}
}

http://127.0.0.1:$((PORT_BASE + 2)) {
	reverse_proxy $BACKEND {
		transport http {
			keepalive_idle_conns_per_host $IDLE_CONNS
		}
	}
}
EOF

"$CADDY" run --config "$work/Caddyfile" --adapter caddyfile > "$work/caddy.log" 2>&1 &
pids+=($!)
CADDY_PID=$!
for _ in $(seq 1 100); do
	curl -fsS -o /dev/null "http://$ADMIN/config/" 2> /dev/null && break
	sleep 0.1
done
if ! curl -fsS -o /dev/null "http://$ADMIN/config/"; then
	log "the gateway did not start:"
	tail -20 "$work/caddy.log" >&2
	exit 1
fi

# A second gateway with durability write: its own store, no plain proxy site.
CADDY_W_PID=
if wanted write; then
	sed -e "s#admin $ADMIN#admin $ADMIN_W#" -e "s#http_port $((PORT_BASE + 1))#http_port $((PORT_BASE + 5))#" \
		-e "s#store $work/platform.db#store $work/write/platform.db\n\t\tdurability write${WRITE_FLUSH:+\n\t\tflush_interval $WRITE_FLUSH}#" \
		-e "s#^http://127.0.0.1:$((PORT_BASE + 1)) {#http://127.0.0.1:$((PORT_BASE + 5)) {#" \
		"$work/Caddyfile" | awk -v proxy="http://127.0.0.1:$((PORT_BASE + 2)) {" '
			$0 == proxy { skip = 1 } !skip { print } skip && $0 == "}" { skip = 0 }' > "$work/Caddyfile.write"
	"$CADDY" run --config "$work/Caddyfile.write" --adapter caddyfile > "$work/caddy-write.log" 2>&1 &
	pids+=($!)
	CADDY_W_PID=$!
	for _ in $(seq 1 100); do
		curl -fsS -o /dev/null "http://$ADMIN_W/config/" 2> /dev/null && break
		sleep 0.1
	done
	if ! curl -fsS -o /dev/null "http://$ADMIN_W/config/"; then
		log "the durability write gateway did not start:"
		tail -20 "$work/caddy-write.log" >&2
		exit 1
	fi
fi

# --- seed ---------------------------------------------------------------------
seed() { # seed <admin address>: prints a new service key
	local k
	k=$("$CADDY" platform key create --address "$1" --user bench-user --label bench --json |
		sed -n 's/.*"key": *"\([^"]*\)".*/\1/p')
	"$CADDY" platform subscribe --address "$1" --user bench-user --service bench --product bench > /dev/null
	echo "$k"
}
key=$(seed "$ADMIN")
[ -n "$key" ] || { log "could not create a service key"; exit 1; }
if [ -n "$CADDY_W_PID" ]; then
	key_w=$(seed "$ADMIN_W")
	[ -n "$key_w" ] || { log "could not create a service key on the write gateway"; exit 1; }
	AUTH_W="Authorization: Bearer $key_w"
	SYNC_URL_W=$GW_W/api/service/bench/endpoint/instant/invoke
	SLOW_URL_W=$GW_W/api/service/bench/endpoint/slow/invoke
	REPORT_URL_W=$GW_W/api/usage/report
fi
AUTH="Authorization: Bearer $key"
SYNC_URL=$GW/api/service/bench/endpoint/instant/invoke
SLOW_URL=$GW/api/service/bench/endpoint/slow/invoke
ASYNC_URL=$GW/api/service/bench/endpoint/job/invoke/async
REPORT_URL=$GW/api/usage/report

expect() { # expect <status> <curl args...>: one request must answer <status>
	local want=$1
	shift
	local got
	got=$(curl -sS -o "$work/last" -w '%{http_code}' "$@")
	if [ "$got" != "$want" ]; then
		log "$* answered $got, not $want: $(head -c 300 "$work/last")"
		return 1
	fi
}
expect 200 "$PROXY/instant"
expect 200 -H "$AUTH" "$SYNC_URL"
expect 200 -H "$AUTH" "$SLOW_URL"
expect 202 -H "$AUTH" -X POST -d '{"q":1}' "$ASYNC_URL"
job=$(sed -n 's/.*"requestId": *"\([^"]*\)".*/\1/p' "$work/last")
STATUS_URL=$GW/api/requests/$job/status
expect 200 -H "$AUTH" "$STATUS_URL"
if [ -n "$CADDY_W_PID" ]; then expect 200 -H "$AUTH_W" "$SYNC_URL_W"; fi

# A signed report, made afresh for each run (timestamps must be recent).
sign_report() {
	local ts body
	ts=$(date +%s)
	body="{\"userId\":\"bench-user\",\"serviceId\":\"bench\",\"unitsUsed\":1,\"timestamp\":$ts}"
	REPORT_BODY=$body
	REPORT_SIG=$(bin/bench/loadgen sign -secret "$SECRET" -body "$body" -timestamp "$ts")
	REPORT_TS=$ts
}
sign_report
have_report=1
if ! expect 200 -X POST -H "X-Platform-Signature: $REPORT_SIG" -H "X-Platform-Timestamp: $REPORT_TS" \
	-H 'Content-Type: application/json' -d "$REPORT_BODY" "$REPORT_URL"; then
	log "usage reports are not served: the report row is left out"
	have_report=0
fi

# --- load -----------------------------------------------------------------------
cat > "$work/post.lua" << 'EOF'
wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY")
EOF

# to_ms <wrk duration>: 812.00us, 1.20ms, 2.01s -> milliseconds
to_ms() {
	awk -v v="$1" 'BEGIN {
		n = v + 0; u = v; sub(/^[0-9.]+/, "", u)
		if (u == "us") n /= 1000; else if (u == "s") n *= 1000; else if (u == "m") n *= 60000
		printf "%.3f", n }'
}

# peak <name> <url> [wrk args...]: $CONNS connections (PEAK_CONNS for one
# run), closed loop, CPU of the Caddy process PEAK_PID (the default
# gateway's); appends "rps p50 p99 cpu" to results/<name>.
peak() {
	local name=$1 url=$2
	shift 2
	local out cpu0 cpu1 pid=${PEAK_PID:-$CADDY_PID}
	cpu0=$(bin/bench/loadgen cputime -pid "$pid")
	out=$(wrk -t2 -c"${PEAK_CONNS:-$CONNS}" -d"$DURATION" --latency "$@" "$url")
	cpu1=$(bin/bench/loadgen cputime -pid "$pid")
	local rps p50 p99 non2xx reqs cpu
	rps=$(awk '/^Requests\/sec:/ {printf "%.0f", $2}' <<< "$out")
	reqs=$(awk '/ requests in / {print $1; exit}' <<< "$out")
	cpu=$(awk -v a="$cpu0" -v b="$cpu1" -v n="$reqs" 'BEGIN { printf "%.1f", (b - a) / n }')
	p50=$(to_ms "$(awk '$1 == "50%" {print $2}' <<< "$out")")
	p99=$(to_ms "$(awk '$1 == "99%" {print $2}' <<< "$out")")
	non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' <<< "$out")
	if [ -n "$non2xx" ] || grep -q 'Socket errors' <<< "$out"; then
		log "$name: errors during the run:"
		log "$out"
		exit 1
	fi
	echo "$rps $p50 $p99 $cpu" >> "$work/results/$name"
	log "  $(printf '%-10s' "$name") $rps req/s  p50 ${p50} ms  p99 ${p99} ms  CPU ${cpu} us/req"
}

# steady <name> <url> <rate> [loadgen args...]: open loop at a fixed rate.
steady() {
	local name=$1 url=$2 rate=$3
	shift 3
	local out
	out=$(bin/bench/loadgen rate -url "$url" -rate "$rate" -duration "$DURATION" -warmup 2s -conns 128 -cpu-pid "${STEADY_PID:-$CADDY_PID}" "$@")
	local rps p50 p99 errors late cpu
	rps=$(sed -n 's/.* rps=\([^ ]*\).*/\1/p' <<< "$out")
	p50=$(sed -n 's/.* p50_ms=\([^ ]*\).*/\1/p' <<< "$out")
	p99=$(sed -n 's/.* p99_ms=\([^ ]*\).*/\1/p' <<< "$out")
	errors=$(sed -n 's/.* errors=\([^ ]*\).*/\1/p' <<< "$out")
	late=$(sed -n 's/.* late=\([^ ]*\).*/\1/p' <<< "$out")
	cpu=$(sed -n 's/.* cpu_us=\([^ ]*\).*/\1/p' <<< "$out")
	if [ "$errors" != 0 ]; then
		log "$name: $errors requests failed: $out"
		exit 1
	fi
	if [ "$late" != 0 ]; then
		log "  $name: could not keep up with $rate req/s; $late requests were never sent (counted at their wait)"
	fi
	echo "$rps $p50 $p99 ${cpu:-0}" >> "$work/results/$name"
	log "  $(printf '%-10s' "$name") $rps req/s  p50 ${p50} ms  p99 ${p99} ms  CPU ${cpu} us/req  (constant rate $rate/s)"
}

mkdir -p "$work/results"
# The disk under the store: with durability sync a call's settlement is
# acknowledged after a group fdatasync of the settlement log.
fsync_probe=$(bin/bench/loadgen fsync -dir "$work" -n 200 -size 4096)
fsync_median=$(sed -n 's/.* median_ms=\([^ ]*\).*/\1/p' <<< "$fsync_probe")
fsync_p90=$(sed -n 's/.* p90_ms=\([^ ]*\).*/\1/p' <<< "$fsync_probe")
log "disk next to the store: 4 KiB write + fdatasync, median ${fsync_median} ms, p90 ${fsync_p90} ms (200 writes)"
log "warming up"
wrk -t2 -c"$CONNS" -d3s "$PROXY/instant" > /dev/null
wrk -t2 -c"$CONNS" -d3s -H "$AUTH" "$SYNC_URL" > /dev/null

for round in $(seq 1 "$ROUNDS"); do
	log "round $round of $ROUNDS"
	peak proxy "$PROXY/instant"
	# Half of this round's peak: the machine's speed drifts between rounds,
	# and a rate fixed from the first would be more than half in a slow one.
	half=$(tail -1 "$work/results/proxy" | awk '{printf "%d", $1 / 2}')
	echo "$half" >> "$work/results/rates"
	if wanted sync; then peak sync "$SYNC_URL" -H "$AUTH"; fi
	if wanted 256; then
		# Paired with plain reverse_proxy at the same 256 connections.
		PEAK_CONNS=256 peak proxy-256 "$PROXY/instant"
		PEAK_CONNS=256 peak sync-256 "$SYNC_URL" -H "$AUTH"
	fi
	if [ -n "$CADDY_W_PID" ]; then PEAK_PID=$CADDY_W_PID peak sync-write "$SYNC_URL_W" -H "$AUTH_W"; fi
	if wanted async; then
		BENCH_BODY='{"q":1}' peak async "$ASYNC_URL" -H "$AUTH" -H 'Content-Type: application/json' -s "$work/post.lua"
	fi
	if wanted status; then peak status "$STATUS_URL" -H "$AUTH"; fi
	if wanted report && [ "$have_report" = 1 ]; then
		sign_report
		BENCH_BODY=$REPORT_BODY peak report "$REPORT_URL" -s "$work/post.lua" -H 'Content-Type: application/json' \
			-H "X-Platform-Signature: $REPORT_SIG" -H "X-Platform-Timestamp: $REPORT_TS"
		if [ -n "$CADDY_W_PID" ]; then
			BENCH_BODY=$REPORT_BODY PEAK_PID=$CADDY_W_PID peak report-write "$REPORT_URL_W" -s "$work/post.lua" \
				-H 'Content-Type: application/json' -H "X-Platform-Signature: $REPORT_SIG" -H "X-Platform-Timestamp: $REPORT_TS"
		fi
	fi
	if wanted 5ms; then
		steady proxy-5ms "$PROXY/slow" "$half"
		steady sync-5ms "$SLOW_URL" "$half" -H "$AUTH"
		# The same at half the gateway's own peak: what a call adds when
		# the gateway is not overloaded, if half the proxy's peak is more
		# than it can take.
		if wanted sync; then
			low=$(tail -1 "$work/results/sync" | awk '{printf "%d", $1 / 2}')
			echo "$low" >> "$work/results/low-rates"
			steady proxy-5ms-low "$PROXY/slow" "$low"
			steady sync-5ms-low "$SLOW_URL" "$low" -H "$AUTH"
			# durability write at the same rate: its calls do not wait for
			# an fdatasync, so the difference to the row above is what
			# waiting for the disk adds.
			if [ -n "$CADDY_W_PID" ]; then
				STEADY_PID=$CADDY_W_PID steady write-5ms-low "$SLOW_URL_W" "$low" -H "$AUTH_W"
			fi
		fi
	fi
done

if [ -n "$PROFILE_DIR" ]; then
	mkdir -p "$PROFILE_DIR"
	log "profiling the gateway (CPU, 6 s each: sync, status, plain, write, async, report) into $PROFILE_DIR"
	wrk -t2 -c"$CONNS" -d8s -H "$AUTH" "$SYNC_URL" > /dev/null &
	pids+=($!)
	sleep 1
	curl -sS -o "$PROFILE_DIR/sync.pprof" "http://$ADMIN/debug/pprof/profile?seconds=6"
	wait $!
	curl -sS -o "$PROFILE_DIR/allocs.pprof" "http://$ADMIN/debug/pprof/allocs"
	wrk -t2 -c"$CONNS" -d8s -H "$AUTH" "$STATUS_URL" > /dev/null &
	pids+=($!)
	sleep 1
	curl -sS -o "$PROFILE_DIR/status.pprof" "http://$ADMIN/debug/pprof/profile?seconds=6"
	wait $!
	# Plain reverse_proxy in the same process, the baseline of every
	# difference, and the durability write gateway under sync load.
	wrk -t2 -c"$CONNS" -d8s "$PROXY/instant" > /dev/null &
	pids+=($!)
	sleep 1
	curl -sS -o "$PROFILE_DIR/plain.pprof" "http://$ADMIN/debug/pprof/profile?seconds=6"
	wait $!
	if [ -n "$CADDY_W_PID" ]; then
		wrk -t2 -c"$CONNS" -d8s -H "$AUTH_W" "$SYNC_URL_W" > /dev/null &
		pids+=($!)
		sleep 1
		curl -sS -o "$PROFILE_DIR/write.pprof" "http://$ADMIN_W/debug/pprof/profile?seconds=6"
		wait $!
	fi
	if wanted async; then
		BENCH_BODY='{"q":1}' wrk -t2 -c"$CONNS" -d8s -s "$work/post.lua" -H "$AUTH" -H 'Content-Type: application/json' \
			"$ASYNC_URL" > /dev/null &
		pids+=($!)
		sleep 1
		curl -sS -o "$PROFILE_DIR/async.pprof" "http://$ADMIN/debug/pprof/profile?seconds=6"
		wait $!
	fi
	if [ "$have_report" = 1 ]; then
		sign_report
		BENCH_BODY=$REPORT_BODY wrk -t2 -c"$CONNS" -d8s -s "$work/post.lua" -H 'Content-Type: application/json' \
			-H "X-Platform-Signature: $REPORT_SIG" -H "X-Platform-Timestamp: $REPORT_TS" "$REPORT_URL" > /dev/null &
		pids+=($!)
		sleep 1
		curl -sS -o "$PROFILE_DIR/report.pprof" "http://$ADMIN/debug/pprof/profile?seconds=6"
		wait $!
	fi
	cp "$CADDY" "$PROFILE_DIR/caddy"
	# The store's group commits over the whole run: how long one took and
	# how many writes it carried.
	curl -sS "http://$ADMIN/metrics" | grep '^platform_store_commit' > "$PROFILE_DIR/commits.txt" || true
	awk '/^platform_store_commit_seconds_sum/ {s = $2} /^platform_store_commit_seconds_count/ {n = $2}
		/^platform_store_commit_writes_sum/ {w = $2}
		END { if (n) printf "group commits: %d, mean %.3f ms, mean %.1f writes each\n", n, 1000 * s / n, w / n }' \
		"$PROFILE_DIR/commits.txt" >&2
fi

# --- table ----------------------------------------------------------------------
# median <file> <column>
median() {
	awk -v c="$2" '{print $c}' "$1" | sort -g | awk '{v[NR] = $1} END {
		if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# paired <file a> <file b> <awk expr>: the median over rounds of the
# expression of a's and b's columns (a: $1 req/s, $2 p50, $3 p99, $4 CPU
# us/req; b: $5-$8); the two runs of a round ran back to back, so pairing
# them cancels the machine's drift.
paired() {
	# A row that did not run (BENCH_ONLY) has nothing to pair.
	if [ ! -s "$1" ] || [ ! -s "$2" ]; then
		echo 0
		return
	fi
	paste -d' ' "$1" "$2" | awk "{ printf \"%.3f\\n\", $3 }" | sort -g | awk '{v[NR] = $1} END {
		if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

r=$work/results
for f in sync proxy-256 sync-256 sync-write report-write async status report proxy-5ms sync-5ms proxy-5ms-low sync-5ms-low write-5ms-low low-rates; do touch "$r/$f"; done
sync_ratio=$(paired "$r/sync" "$r/proxy" '$1 / $5')
added_p50=$(paired "$r/sync-5ms" "$r/proxy-5ms" '$2 - $6')
added_p99=$(paired "$r/sync-5ms" "$r/proxy-5ms" '$3 - $7')
echo
echo "Median of $ROUNDS rounds, $DURATION each, $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'),"
if [ -n "${BENCH_CADDY:-}" ]; then
	echo "binary $BENCH_CADDY (BENCH_CADDY; the tools from commit $(git rev-parse --short HEAD 2> /dev/null || echo unknown));"
else
	echo "commit $(git rev-parse --short HEAD 2> /dev/null || echo unknown)$(git diff --quiet HEAD -- . ':!docs' ':!*.md' 2> /dev/null || echo ' (with local changes)');"
fi
echo "peak rows: $CONNS connections, instant backend; 5 ms rows: a constant rate of half the round's plain"
echo "reverse_proxy peak (median $(median "$r/rates" 1) req/s), latency from each request's due time."
echo "CPU: the Caddy process's user + system time per request served; \"- plain\" and \"/ plain\" pair each"
echo "run with plain reverse_proxy's in the same round (peak rows: the peak run; 5 ms rows: the 5 ms run"
echo "at the same rate). Both sites: keepalive_idle_conns_per_host $IDLE_CONNS."
echo "Disk next to the store: 4 KiB write + fdatasync, median ${fsync_median} ms (p90 ${fsync_p90} ms)."
echo
# row <label> <file> <comparison> [<baseline file for CPU>]
row() {
	[ -s "$2" ] || return 0
	local diff=- ratio=-
	if [ -n "${4:-}" ] && [ -s "$4" ]; then
		diff=$(paired "$2" "$4" '$4 - $8')
		ratio=$(paired "$2" "$4" '($8 > 0 ? $4 / $8 : 0)')
		ratio=$(printf '%.2fx' "$ratio")
		diff=$(printf '%+.0f' "$diff")
	fi
	printf '| %-34s | %8s | %8s | %8s | %-32s | %7s | %7s | %7s |\n' "$1" "$(median "$2" 1)" "$(median "$2" 2)" \
		"$(median "$2" 3)" "$3" "$(median "$2" 4)" "$diff" "$ratio" | tee -a "$work/table.md"
}
printf '| %-34s | %8s | %8s | %8s | %-32s | %7s | %7s | %7s |\n' scenario "req/s" "p50 ms" "p99 ms" \
	"vs. plain reverse_proxy" "CPU us" "- plain" "/ plain"
printf '|%s|%s|%s|%s|%s|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..36})" "----------" "----------" "----------" \
	"$(printf -- '-%.0s' {1..34})" "---------" "---------" "---------"
row "plain reverse_proxy" "$r/proxy" "1.00x (baseline)"
row "sync invoke" "$r/sync" "${sync_ratio}x throughput" "$r/proxy"
row "plain reverse_proxy, 256 connections" "$r/proxy-256" "baseline of the next row"
row "sync invoke, 256 connections" "$r/sync-256" "$(paired "$r/sync-256" "$r/proxy-256" '$1 / $5')x throughput" "$r/proxy-256"
row "sync invoke, durability write" "$r/sync-write" "$(paired "$r/sync-write" "$r/proxy" '$1 / $5')x throughput" "$r/proxy"
row "async invoke (202)" "$r/async" "$(paired "$r/async" "$r/proxy" '$1 / $5')x throughput" "$r/proxy"
row "job status poll" "$r/status" "$(paired "$r/status" "$r/proxy" '$1 / $5')x throughput" "$r/proxy"
if [ "$have_report" = 1 ]; then
	row "usage report (signed, durable)" "$r/report" "$(paired "$r/report" "$r/proxy" '$1 / $5')x throughput" "$r/proxy"
	row "usage report, durability write" "$r/report-write" "$(paired "$r/report-write" "$r/proxy" '$1 / $5')x throughput" "$r/proxy"
fi
row "plain reverse_proxy, 5 ms backend" "$r/proxy-5ms" "baseline at half the peak rate"
row "sync invoke, 5 ms backend" "$r/sync-5ms" "$(printf '%+.3f ms p50, %+.3f ms p99' "$added_p50" "$added_p99")" "$r/proxy-5ms"
if [ -s "$r/sync-5ms-low" ]; then
	row "plain reverse_proxy, 5 ms, lower" "$r/proxy-5ms-low" "at half the sync peak ($(median "$r/low-rates" 1)/s)"
	row "sync invoke, 5 ms, lower rate" "$r/sync-5ms-low" "$(printf '%+.3f ms p50, %+.3f ms p99' \
		"$(paired "$r/sync-5ms-low" "$r/proxy-5ms-low" '$2 - $6')" "$(paired "$r/sync-5ms-low" "$r/proxy-5ms-low" '$3 - $7')")" \
		"$r/proxy-5ms-low"
	row "sync invoke, durability write, 5 ms, lower" "$r/write-5ms-low" "$(printf '%+.3f ms p50, %+.3f ms p99' \
		"$(paired "$r/write-5ms-low" "$r/proxy-5ms-low" '$2 - $6')" "$(paired "$r/write-5ms-low" "$r/proxy-5ms-low" '$3 - $7')")" \
		"$r/proxy-5ms-low"
fi
if [ -s "$r/sync" ]; then
	echo
	echo "Per round, sync invoke / plain: throughput $(paste -d' ' "$r/sync" "$r/proxy" | awk '{printf "%.2fx ", $1 / $5}')," \
		"CPU per request $(paste -d' ' "$r/sync" "$r/proxy" | awk '{printf "%.2fx ", ($8 > 0 ? $4 / $8 : 0)}')"
fi

# The targets (docs/performance.md, "Results"): what the gateway may cost
# over plain reverse_proxy, in CPU per request and in throughput.
verdict() { if awk "BEGIN { exit !($1) }"; then echo met; else echo MISSED; fi; }
target() { printf '  %-58s %12s   %s\n' "$1" "$2" "$(verdict "$3")"; }
echo
echo "Targets:"
if [ -s "$r/sync" ]; then
	d=$(paired "$r/sync" "$r/proxy" '$4 - $8')
	q=$(paired "$r/sync" "$r/proxy" '($8 > 0 ? $4 / $8 : 0)')
	target "sync invoke, durability sync: CPU over plain <= 60 us" "$(printf '%+.0f us' "$d")" "$d <= 60"
	target "sync invoke, durability sync: CPU / plain <= 1.5x" "$(printf '%.2fx' "$q")" "$q <= 1.5"
fi
if [ -s "$r/sync-write" ]; then
	d=$(paired "$r/sync-write" "$r/proxy" '$4 - $8')
	q=$(paired "$r/sync-write" "$r/proxy" '($8 > 0 ? $4 / $8 : 0)')
	t=$(paired "$r/sync-write" "$r/proxy" '$1 / $5')
	target "sync invoke, durability write: CPU over plain <= 60 us" "$(printf '%+.0f us' "$d")" "$d <= 60"
	target "sync invoke, durability write: CPU / plain <= 1.4x" "$(printf '%.2fx' "$q")" "$q <= 1.4"
	target "sync invoke, durability write: >= 0.75x plain" "$(printf '%.3fx' "$t")" "$t >= 0.75"
fi
if [ -s "$r/sync-256" ]; then
	q=$(paired "$r/sync-256" "$r/proxy-256" '$1 / $5')
	target "sync invoke, durability sync, 256 connections: >= 0.75x" "$(printf '%.3fx' "$q")" "$q >= 0.75"
fi
if [ -s "$r/async" ]; then
	q=$(paired "$r/async" "$r/proxy" '$1 / $5')
	target "async invoke (202): >= 0.70x plain" "$(printf '%.3fx' "$q")" "$q >= 0.70"
fi
if [ -s "$r/report" ]; then
	q=$(paired "$r/report" "$r/proxy" '$1 / $5')
	target "usage reports: >= 2x plain's requests/s" "$(printf '%.3fx' "$q")" "$q >= 2"
fi
if [ -s "$r/status" ]; then
	q=$(paired "$r/status" "$r/proxy" '$1 / $5')
	target "job status polls: no slower than plain" "$(printf '%.3fx' "$q")" "$q >= 1"
fi
if [ -s "$r/sync-5ms-low" ]; then
	p50=$(paired "$r/sync-5ms-low" "$r/proxy-5ms-low" '$2 - $6')
	bound=$(awk -v f="$fsync_median" 'BEGIN { printf "%.3f", f + 0.5 }')
	target "5 ms backend, durability sync: p50 <= fdatasync + 0.5 ms" "$(printf '%+.2f ms' "$p50")" "$p50 <= $bound"
fi
if [ -s "$r/write-5ms-low" ]; then
	p50=$(paired "$r/write-5ms-low" "$r/proxy-5ms-low" '$2 - $6')
	p99=$(paired "$r/write-5ms-low" "$r/proxy-5ms-low" '$3 - $7')
	target "5 ms backend, durability write: p50 <= +1 ms" "$(printf '%+.2f ms' "$p50")" "$p50 <= 1"
	target "5 ms backend, durability write: p99 <= +5 ms" "$(printf '%+.2f ms' "$p99")" "$p99 <= 5"
fi

# The chart of CPU per request (docs/performance.md shows the latest).
CHART=${BENCH_CHART:-bin/bench/cpu.svg}
if [ -n "$CHART" ] && [ -s "$work/table.md" ]; then
	go build -o bin/bench/chart ./scripts/bench/chart
	if bin/bench/chart -title "make bench at $(git rev-parse --short HEAD 2> /dev/null || echo '?'): CPU per request of the Caddy process (µs)" \
		< "$work/table.md" > "$CHART.tmp"; then
		mv "$CHART.tmp" "$CHART"
		log "chart: $CHART"
	else
		rm -f "$CHART.tmp"
	fi
fi
