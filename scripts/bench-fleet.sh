#!/usr/bin/env bash
# The gateway on PostgreSQL (store postgres, docs/fleet.md) against the
# same gateway on bbolt, in the same run (make bench-fleet).
#
# Three gateway processes of the same binary run side by side on loopback,
# all forwarding to one backend (scripts/bench/backend: /instant answers at
# once, /slow after 5 ms):
#
#   bolt   one node on a bbolt file (the baseline)
#   bolt2  a second node on a bbolt file of its own
#   pg-a   a node on one PostgreSQL database (settle log, the default)
#   pg-b   a second node on the same database
#   pg-c   a node with settle commit, on a database of its own
#
# Each round runs, one after another:
#
#   bolt       sync invoke on the bbolt node, BENCH_CONNS connections (wrk)
#   pg1        the same on pg-a alone
#   pgc        the same on pg-c alone (settle commit)
#   bolt2      the same on bolt and bolt2 at once: two nodes sharing the
#              machine, the baseline of pg2
#   pg2        the same on pg-a and pg-b at once (BENCH_CONNS each): the
#              row gives req/s per node and the total
#   bolt-5ms   sync invoke, 5 ms backend, open loop at half the round's
#              lower peak of bolt and pg1, a rate both take without
#              queueing (scripts/bench/loadgen: latency from each
#              request's due time)
#   pg1-5ms    the same on pg-a
#
# For every PostgreSQL run the database's committed transactions are read
# from pg_stat_database before and after (after waiting out the server's
# statistics flush), and divided by the calls served: database round
# trips per call, lease renewals and the notification listener included.
# The subscription's product has a quota (hard-limited, so leases are in
# play) that the run never reaches.
#
# Needs wrk (installed from Debian when missing), psql, and a PostgreSQL
# server: PLATFORM_TEST_PG_DSN (default
# postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable, a URL) names
# it; a database bench_fleet_<pid> is created there and dropped at the end.
#
# Settings: BENCH_ROUNDS (3), BENCH_DURATION (8s), BENCH_CONNS (64),
# BENCH_FLEET_PORT_BASE (3450: backend +0, bolt admin/http +1/+2, pg-a
# +3/+4, pg-b +5/+6, bolt2 +7/+8, pg-c +9/+10), BENCH_LEASE_MAX
# (lease_max, 1000 units), BENCH_CADDY (a binary built already),
# BENCH_PROFILE (a directory: CPU profiles of the bbolt and PostgreSQL
# nodes after the rounds), BENCH_PROFILE_SECONDS (how long each, 6).
#
# CPU per call: each gateway process's CPU time (user + system, from
# /proc) and the PostgreSQL server's (every postgres process, and the
# backends its postmaster reaped) over a run and the second after it,
# divided by the calls served. On two shared cores this is steadier than
# throughput, and a node on PostgreSQL is compared by what it and the
# database spend together against what the bbolt node spends.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${BENCH_ROUNDS:-3}
DURATION=${BENCH_DURATION:-8s}
CONNS=${BENCH_CONNS:-64}
PB=${BENCH_FLEET_PORT_BASE:-3450}
LEASE_MAX=${BENCH_LEASE_MAX:-1000}
PG=${PLATFORM_TEST_PG_DSN:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
BACKEND=127.0.0.1:$PB
SECRET=bench-secret-0123456789abcdef0123456789

log() { printf '%s\n' "$*" >&2; }

# --- tools -----------------------------------------------------------------
if ! command -v wrk > /dev/null; then
	log "installing wrk (Debian package)"
	sudo=""
	if [ "$(id -u)" != 0 ]; then sudo=sudo; fi
	$sudo apt-get update -qq > /dev/null && $sudo apt-get install -y -qq wrk > /dev/null
fi
command -v psql > /dev/null || { log "bench-fleet needs psql (Debian: postgresql-client)"; exit 1; }
psql -X -q -d "$PG" -Atc 'SELECT 1' > /dev/null || { log "cannot reach PostgreSQL at PLATFORM_TEST_PG_DSN"; exit 1; }
mkdir -p bin/bench
CADDY=${BENCH_CADDY:-bin/caddy}
if [ -z "${BENCH_CADDY:-}" ]; then
	go build -o bin/caddy ./caddy
fi
go build -o bin/bench/backend ./scripts/bench/backend
go build -o bin/bench/loadgen ./scripts/bench/loadgen

# --- database and processes ------------------------------------------------------
DB=bench_fleet_$$
DSN=$(sed -E "s#^(postgres(ql)?://[^/?]*)(/[^?]*)?#\1/$DB#" <<< "$PG")
DBC=bench_fleet_commit_$$
DSNC=$(sed -E "s#^(postgres(ql)?://[^/?]*)(/[^?]*)?#\1/$DBC#" <<< "$PG")
psql -X -q -d "$PG" -c "CREATE DATABASE $DB"
psql -X -q -d "$PG" -c "CREATE DATABASE $DBC"
work=$(mktemp -d "${TMPDIR:-/tmp}/platform-bench-fleet.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
	wait 2> /dev/null || true
	psql -X -q -d "$PG" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" || true
	psql -X -q -d "$PG" -c "DROP DATABASE IF EXISTS $DBC WITH (FORCE)" || true
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bin/bench/backend -addr "$BACKEND" -delay 5ms > "$work/backend.log" 2>&1 &
pids+=($!)

# node <name> <admin port> <http port> <store lines>
node() {
	local name=$1 admin=$2 http=$3 storecfg=$4
	cat > "$work/$name.Caddyfile" << EOF
{
	admin 127.0.0.1:$admin
	http_port $http
	auto_https off
	grace_period 1s
	log {
		level WARN
	}
	platform {
		$storecfg
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

http://127.0.0.1:$http {
	platform_usage
	platform_gateway
	reverse_proxy {
		dynamic platform
		transport platform {
			keepalive_idle_conns_per_host 128
		}
	}
}
EOF
	XDG_DATA_HOME=$work/$name-data XDG_CONFIG_HOME=$work/$name-config \
		"$CADDY" run --config "$work/$name.Caddyfile" --adapter caddyfile > "$work/$name.log" 2>&1 &
	pids+=($!)
	eval "PID_$name=$!"
	for _ in $(seq 1 150); do
		curl -fsS -o /dev/null "http://127.0.0.1:$admin/config/" 2> /dev/null && return 0
		sleep 0.1
	done
	log "the $name node did not start:"
	tail -20 "$work/$name.log" >&2
	exit 1
}
# pgstore <node id> <dsn> <settle>
pgstore() {
	printf 'store postgres {\n\t\t\tdsn "%s"\n\t\t\tnode_id %s\n\t\t\tlease_max %s\n\t\t\tsettle %s\n\t\t}' \
		"$2" "$1" "$LEASE_MAX" "$3"
}
node bolt $((PB + 1)) $((PB + 2)) "store $work/platform.db"
node bolt2 $((PB + 7)) $((PB + 8)) "store $work/platform2.db"
node pga $((PB + 3)) $((PB + 4)) "$(pgstore pg-a "$DSN" log)"
node pgb $((PB + 5)) $((PB + 6)) "$(pgstore pg-b "$DSN" log)"
node pgc $((PB + 9)) $((PB + 10)) "$(pgstore pg-c "$DSNC" commit)"

# key <admin port>: a key of bench-user, subscribed to bench.
key() {
	local k
	k=$("$CADDY" platform key create --address "127.0.0.1:$1" --user bench-user --label bench --json |
		sed -n 's/.*"key": *"\([^"]*\)".*/\1/p')
	"$CADDY" platform subscribe --address "127.0.0.1:$1" --user bench-user --service bench --product bench > /dev/null
	[ -n "$k" ] || { log "could not create a service key on 127.0.0.1:$1"; exit 1; }
	echo "$k"
}
BOLT_AUTH="Authorization: Bearer $(key $((PB + 1)))"
BOLT2_AUTH="Authorization: Bearer $(key $((PB + 7)))"
PG_AUTH="Authorization: Bearer $(key $((PB + 3)))"
PGC_AUTH="Authorization: Bearer $(key $((PB + 9)))"
BOLT_URL=http://127.0.0.1:$((PB + 2))/api/service/bench/endpoint
BOLT2_URL=http://127.0.0.1:$((PB + 8))/api/service/bench/endpoint
PGA_URL=http://127.0.0.1:$((PB + 4))/api/service/bench/endpoint
PGB_URL=http://127.0.0.1:$((PB + 6))/api/service/bench/endpoint
PGC_URL=http://127.0.0.1:$((PB + 10))/api/service/bench/endpoint
for u in "$BOLT_URL/instant/invoke|$BOLT_AUTH" "$BOLT2_URL/instant/invoke|$BOLT2_AUTH" "$PGA_URL/instant/invoke|$PG_AUTH" \
	"$PGB_URL/instant/invoke|$PG_AUTH" "$PGC_URL/instant/invoke|$PGC_AUTH"; do
	got=$(curl -sS -o "$work/last" -w '%{http_code}' -H "${u#*|}" "${u%%|*}")
	[ "$got" = 200 ] || { log "${u%%|*} answered $got: $(head -c 300 "$work/last")"; exit 1; }
done

# --- load -----------------------------------------------------------------------
to_ms() {
	awk -v v="$1" 'BEGIN {
		n = v + 0; u = v; sub(/^[0-9.]+/, "", u)
		if (u == "us") n /= 1000; else if (u == "s") n *= 1000; else if (u == "m") n *= 60000
		printf "%.3f", n }'
}
# commits: the database's committed transactions so far. The server
# publishes a backend's counts at most once a second, or 10 s after it
# goes idle: wait that out first.
commits() {
	sleep 11
	psql -X -q -d "$PG" -Atc "SELECT xact_commit FROM pg_stat_database WHERE datname = '${1:-$DB}'"
}
# wrkrun <url> <auth>: "rps p50 p99 requests"
wrkrun() {
	local out rps p50 p99 reqs
	out=$(wrk -t2 -c"$CONNS" -d"$DURATION" --latency -H "$2" "$1")
	if grep -q 'Non-2xx or 3xx responses:\|Socket errors' <<< "$out"; then
		log "errors during the run on $1:"
		log "$out"
		exit 1
	fi
	rps=$(awk '/^Requests\/sec:/ {printf "%.0f", $2}' <<< "$out")
	reqs=$(awk '/ requests in / {print $1; exit}' <<< "$out")
	p50=$(to_ms "$(awk '$1 == "50%" {print $2}' <<< "$out")")
	p99=$(to_ms "$(awk '$1 == "99%" {print $2}' <<< "$out")")
	echo "$rps $p50 $p99 $reqs"
}
# steady <url> <auth> <rate>: "rps p50 p99 requests"
steady() {
	local out
	out=$(bin/bench/loadgen rate -url "$1" -rate "$3" -duration "$DURATION" -warmup 2s -conns 128 -H "$2")
	local errors
	errors=$(sed -n 's/.* errors=\([^ ]*\).*/\1/p' <<< "$out")
	[ "$errors" = 0 ] || { log "$errors requests failed: $out"; exit 1; }
	echo "$(sed -n 's/.* rps=\([^ ]*\).*/\1/p' <<< "$out") $(sed -n 's/.* p50_ms=\([^ ]*\).*/\1/p' <<< "$out")" \
		"$(sed -n 's/.* p99_ms=\([^ ]*\).*/\1/p' <<< "$out") $(sed -n 's/^requests=\([^ ]*\).*/\1/p' <<< "$out")"
}

# ticks <pid...>: the processes' CPU time so far (user + system, clock
# ticks). pgticks: the PostgreSQL server's, every live postgres process
# and the children its postmaster has reaped (a backend that ended).
ticks() {
	local p t=0
	for p in "$@"; do
		t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
	done
	echo "$t"
}
pgticks() {
	local p t=0 pm
	pm=$(pgrep -o -u postgres -x postgres)
	t=$(awk '{print $16 + $17}' "/proc/$pm/stat")
	for p in $(pgrep -u postgres -x postgres); do
		t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat" 2> /dev/null || echo 0)))
	done
	echo "$t"
}
HZ=$(getconf CLK_TCK)
# cpurec <file> <requests> <gateway ticks before> <after> <pg before> <after>:
# appends "gateway µs/call, PostgreSQL µs/call" of one run.
cpurec() {
	awk -v n="$2" -v g="$(($4 - $3))" -v p="$(($6 - $5))" -v hz="$HZ" \
		'BEGIN { printf "%.1f %.1f\n", g * 1e6 / hz / n, p * 1e6 / hz / n }' >> "$1"
}
# measured <file> <gateway pids> <command...>: runs the command (a wrkrun),
# prints its output, and records the CPU per call of the gateways named
# and of PostgreSQL over the run and the second after it (the settlement
# log's shipments of the run's last calls).
measured() {
	local file=$1 pids=$2 g0 p0 g1 p1 out reqs
	shift 2
	# shellcheck disable=SC2086
	g0=$(ticks $pids)
	p0=$(pgticks)
	out=$("$@")
	sleep 1
	# shellcheck disable=SC2086
	g1=$(ticks $pids)
	p1=$(pgticks)
	reqs=$(awk '{print $4}' <<< "$out")
	cpurec "$file" "$reqs" "$g0" "$g1" "$p0" "$p1"
	echo "$out"
}

r=$work/results
mkdir -p "$r"
log "warming up"
wrk -t2 -c"$CONNS" -d3s -H "$BOLT_AUTH" "$BOLT_URL/instant/invoke" > /dev/null
wrk -t2 -c"$CONNS" -d3s -H "$PG_AUTH" "$PGA_URL/instant/invoke" > /dev/null
wrk -t2 -c"$CONNS" -d3s -H "$PG_AUTH" "$PGB_URL/instant/invoke" > /dev/null
wrk -t2 -c"$CONNS" -d3s -H "$BOLT2_AUTH" "$BOLT2_URL/instant/invoke" > /dev/null
wrk -t2 -c"$CONNS" -d3s -H "$PGC_AUTH" "$PGC_URL/instant/invoke" > /dev/null
for round in $(seq 1 "$ROUNDS"); do
	log "round $round of $ROUNDS"
	bolt=$(measured "$r/cpu-bolt" "$PID_bolt" wrkrun "$BOLT_URL/instant/invoke" "$BOLT_AUTH")
	echo "$bolt" >> "$r/bolt"
	log "  bolt      $bolt (req/s p50 p99 requests), CPU µs/call $(tail -1 "$r/cpu-bolt" | cut -d' ' -f1)"

	c0=$(commits)
	pg1=$(measured "$r/cpu-pg1" "$PID_pga" wrkrun "$PGA_URL/instant/invoke" "$PG_AUTH")
	c1=$(commits)
	echo "$pg1 $((c1 - c0))" >> "$r/pg1"
	log "  pg1       $pg1, $((c1 - c0)) commits, CPU µs/call gateway, PostgreSQL: $(tail -1 "$r/cpu-pg1")"

	cc0=$(commits "$DBC")
	pgc=$(measured "$r/cpu-pgc" "$PID_pgc" wrkrun "$PGC_URL/instant/invoke" "$PGC_AUTH")
	cc1=$(commits "$DBC")
	echo "$pgc $((cc1 - cc0))" >> "$r/pgc"
	log "  pgc       $pgc, $((cc1 - cc0)) commits (settle commit), CPU µs/call gateway, PostgreSQL: $(tail -1 "$r/cpu-pgc")"

	g0=$(ticks "$PID_bolt" "$PID_bolt2")
	p0=$(pgticks)
	wrkrun "$BOLT2_URL/instant/invoke" "$BOLT2_AUTH" > "$work/bolt2.out" &
	b=$!
	bolta=$(wrkrun "$BOLT_URL/instant/invoke" "$BOLT_AUTH")
	wait "$b"
	sleep 1
	cpurec "$r/cpu-bolt2" "$(($(awk '{print $4}' <<< "$bolta") + $(awk '{print $4}' "$work/bolt2.out")))" \
		"$g0" "$(ticks "$PID_bolt" "$PID_bolt2")" "$p0" "$(pgticks)"
	boltb=$(cat "$work/bolt2.out")
	echo "$bolta $boltb" >> "$r/bolt2"
	log "  bolt2     a: $bolta; b: $boltb, CPU µs/call $(tail -1 "$r/cpu-bolt2" | cut -d' ' -f1)"
	c1=$(commits)

	g0=$(ticks "$PID_pga" "$PID_pgb")
	p0=$(pgticks)
	wrkrun "$PGB_URL/instant/invoke" "$PG_AUTH" > "$work/pgb.out" &
	b=$!
	pga=$(wrkrun "$PGA_URL/instant/invoke" "$PG_AUTH")
	wait "$b"
	sleep 1
	cpurec "$r/cpu-pg2" "$(($(awk '{print $4}' <<< "$pga") + $(awk '{print $4}' "$work/pgb.out")))" \
		"$g0" "$(ticks "$PID_pga" "$PID_pgb")" "$p0" "$(pgticks)"
	pgb=$(cat "$work/pgb.out")
	c2=$(commits)
	echo "$pga $pgb $((c2 - c1))" >> "$r/pg2"
	log "  pg2       a: $pga; b: $pgb; $((c2 - c1)) commits, CPU µs/call gateways, PostgreSQL: $(tail -1 "$r/cpu-pg2")"

	half=$(awk -v p="$(awk '{print $1}' <<< "$pg1")" '{printf "%d", ($1 < p ? $1 : p) / 2}' <<< "$bolt")
	echo "$half" >> "$r/rates"
	bolt5=$(steady "$BOLT_URL/slow/invoke" "$BOLT_AUTH" "$half")
	echo "$bolt5" >> "$r/bolt-5ms"
	log "  bolt-5ms  $bolt5 at $half/s"
	c3=$(commits)
	pg5=$(steady "$PGA_URL/slow/invoke" "$PG_AUTH" "$half")
	c4=$(commits)
	echo "$pg5 $((c4 - c3))" >> "$r/pg1-5ms"
	log "  pg1-5ms   $pg5 at $half/s, $((c4 - c3)) commits"
done

# BENCH_PROFILE=<dir>: CPU profiles after the rounds, under the rounds'
# loads: the bbolt node (bolt.pprof), PostgreSQL node a alone (pg1.pprof)
# and node a while both PostgreSQL nodes take load (pg2.pprof), each
# BENCH_PROFILE_SECONDS long (6), with the load generator's output next
# to it (<name>.wrk: its calls a second turn samples into CPU per call);
# read them with go tool pprof <dir>/caddy <dir>/pg1.pprof.
if [ -n "${BENCH_PROFILE:-}" ]; then
	mkdir -p "$BENCH_PROFILE"
	ps=${BENCH_PROFILE_SECONDS:-6}
	for s in bolt:$((PB + 1)):$BOLT_URL:BOLT_AUTH pg1:$((PB + 3)):$PGA_URL:PG_AUTH; do
		name=${s%%:*}
		admin=${s#*:}
		admin=${admin%%:*}
		authvar=${s##*:}
		url=${s#*:*:}
		url=${url%:*}
		wrk -t2 -c"$CONNS" -d$((ps + 3))s -H "${!authvar}" "$url/instant/invoke" > "$BENCH_PROFILE/$name.wrk" &
		b=$!
		sleep 1
		curl -fsS -o "$BENCH_PROFILE/$name.pprof" "http://127.0.0.1:$admin/debug/pprof/profile?seconds=$ps"
		wait "$b"
	done
	# pg2: node a while both PostgreSQL nodes take the load.
	wrk -t2 -c"$CONNS" -d$((ps + 3))s -H "$PG_AUTH" "$PGB_URL/instant/invoke" > /dev/null &
	b=$!
	wrk -t2 -c"$CONNS" -d$((ps + 3))s -H "$PG_AUTH" "$PGA_URL/instant/invoke" > "$BENCH_PROFILE/pg2.wrk" &
	b2=$!
	sleep 1
	curl -fsS -o "$BENCH_PROFILE/pg2.pprof" "http://127.0.0.1:$((PB + 3))/debug/pprof/profile?seconds=$ps"
	wait "$b" "$b2"
	cp "$CADDY" "$BENCH_PROFILE/caddy"
	log "profiles in $BENCH_PROFILE (go tool pprof $BENCH_PROFILE/caddy $BENCH_PROFILE/pg1.pprof)"
fi

# --- table ----------------------------------------------------------------------
median() { sort -g | awk '{v[NR] = $1} END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# col <file> <awk expr>: the median over rounds of an expression of a
# file's columns.
col() { awk "{ printf \"%.4f\\n\", $2 }" "$1" | median; }
# f0, f2, f3: a number with 0, 2 or 3 decimals.
f0() { printf '%.0f' "$1"; }
f2() { printf '%.2f' "$1"; }
f3() { printf '%.3f' "$1"; }
# pair <file a> <file b> <awk expr over a's columns then b's>
pair() { paste -d' ' "$1" "$2" | awk "{ printf \"%.4f\\n\", $3 }" | median; }

# bolt: $1 rps $2 p50 $3 p99 $4 requests
# pg1: the same and $5 commits; pg2: a $1-$4, b $5-$8, $9 commits
ratio1=$(pair "$r/pg1" "$r/bolt" '$1 / $6')
ratio2=$(pair "$r/pg2" "$r/bolt" '($1 + $5) / 2 / $10')
ratio2b=$(pair "$r/pg2" "$r/bolt2" '($1 + $5) / ($10 + $14)')
ratioc=$(pair "$r/pgc" "$r/bolt" '$1 / $6')
rtc=$(col "$r/pgc" '$5 / $4')
rt1=$(col "$r/pg1" '$5 / $4')
rt2=$(col "$r/pg2" '$9 / ($4 + $8)')
rt5=$(col "$r/pg1-5ms" '$5 / $4')
add50=$(pair "$r/pg1-5ms" "$r/bolt-5ms" '$2 - $7')
add99=$(pair "$r/pg1-5ms" "$r/bolt-5ms" '$3 - $8')
echo
echo "Median of $ROUNDS rounds, $DURATION each, $CONNS connections per node, $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'),"
echo "commit $(git rev-parse --short HEAD 2> /dev/null || echo unknown); PostgreSQL $(psql -X -q -d "$PG" -Atc 'SHOW server_version'),"
echo "lease_max $LEASE_MAX; gateways, PostgreSQL, backend and load generators on one machine."
echo
row() { printf '| %-38s | %7s | %8s | %8s | %-26s | %16s |\n' "$@"; }
row scenario "req/s" "p50 ms" "p99 ms" "vs. bbolt" "round trips/call"
printf '|%s|%s|%s|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..40})" "---------" "----------" "----------" \
	"$(printf -- '-%.0s' {1..28})" "------------------"
row "sync invoke, bbolt, 1 node" "$(f0 "$(col "$r/bolt" '$1')")" "$(f3 "$(col "$r/bolt" '$2')")" \
	"$(f3 "$(col "$r/bolt" '$3')")" "1.00x (baseline)" "-"
row "sync invoke, PostgreSQL, 1 node" "$(f0 "$(col "$r/pg1" '$1')")" "$(f3 "$(col "$r/pg1" '$2')")" \
	"$(f3 "$(col "$r/pg1" '$3')")" "$(f2 "$ratio1")x" "$(f3 "$rt1")"
row "sync invoke, PostgreSQL commit, 1 node" "$(f0 "$(col "$r/pgc" '$1')")" "$(f3 "$(col "$r/pgc" '$2')")" \
	"$(f3 "$(col "$r/pgc" '$3')")" "$(f2 "$ratioc")x" "$(f3 "$rtc")"
row "sync invoke, bbolt, 2 nodes, each" "$(f0 "$(col "$r/bolt2" '($1 + $5) / 2')")" "$(f3 "$(col "$r/bolt2" '($2 + $6) / 2')")" \
	"$(f3 "$(col "$r/bolt2" '($3 + $7) / 2')")" "$(f2 "$(pair "$r/bolt2" "$r/bolt" '($1 + $5) / 2 / $9')")x per node" "-"
row "sync invoke, PostgreSQL, 2 nodes, each" "$(f0 "$(col "$r/pg2" '($1 + $5) / 2')")" "$(f3 "$(col "$r/pg2" '($2 + $6) / 2')")" \
	"$(f3 "$(col "$r/pg2" '($3 + $7) / 2')")" "$(f2 "$ratio2")x; $(f2 "$ratio2b")x of 2 bbolt" "$(f3 "$rt2")"
row "  the 2 nodes together" "$(f0 "$(col "$r/pg2" '$1 + $5')")" "" "" "$(f2 "$(pair "$r/pg2" "$r/bolt" '($1 + $5) / $10')")x" ""
row "sync invoke, 5 ms backend, bbolt" "$(f0 "$(col "$r/bolt-5ms" '$1')")" "$(f3 "$(col "$r/bolt-5ms" '$2')")" \
	"$(f3 "$(col "$r/bolt-5ms" '$3')")" "at $(median < "$r/rates")/s" "-"
row "sync invoke, 5 ms backend, PostgreSQL" "$(f0 "$(col "$r/pg1-5ms" '$1')")" "$(f3 "$(col "$r/pg1-5ms" '$2')")" \
	"$(f3 "$(col "$r/pg1-5ms" '$3')")" "$(printf '%+.3f p50, %+.3f p99' "$add50" "$add99")" "$(f3 "$rt5")"

# CPU per call: cpu-*: $1 gateway µs/call, $2 PostgreSQL µs/call
cb=$(col "$r/cpu-bolt" '$1')
cb2=$(col "$r/cpu-bolt2" '$1')
echo
echo "CPU per call (median over rounds; the process's own CPU time over the run and the second after it, divided by calls):"
crow() { printf '| %-38s | %12s | %14s | %12s | %14s |\n' "$@"; }
crow scenario "gateway µs" "PostgreSQL µs" "together µs" "vs. bbolt"
printf '|%s|%s|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..40})" "--------------" "----------------" "--------------" "----------------"
crow "bbolt, 1 node" "$(f0 "$cb")" "-" "$(f0 "$cb")" "1.00x"
for s in pg1:"PostgreSQL settle log, 1 node" pgc:"PostgreSQL settle commit, 1 node" bolt2:"bbolt, 2 nodes at once" pg2:"PostgreSQL settle log, 2 nodes at once"; do
	f=$r/cpu-${s%%:*}
	g=$(col "$f" '$1')
	if [ "${s%%:*}" = bolt2 ]; then
		crow "${s#*:}" "$(f0 "$g")" "-" "$(f0 "$g")" "$(f2 "$(awk -v a="$g" -v b="$cb" 'BEGIN { print a / b }')")x of 1 node"
		continue
	fi
	t=$(col "$f" '$1 + $2')
	base=$cb
	if [ "${s%%:*}" = pg2 ]; then base=$cb2; fi
	crow "${s#*:}" "$(f0 "$g")" "$(f0 "$(col "$f" '$2')")" "$(f0 "$t")" \
		"$(f2 "$(awk -v a="$t" -v b="$base" 'BEGIN { print a / b }')")x$([ "${s%%:*}" = pg2 ] && echo " of 2 bbolt")"
done

verdict() { if awk "BEGIN { exit !($1) }"; then echo met; else echo MISSED; fi; }
echo
echo "Targets (docs/fleet.md):"
echo "  sync invoke per node >= 0.9x bbolt, 1 node:   $(f2 "$ratio1")x   $(verdict "$ratio1 >= 0.9")"
echo "                                     2 nodes:   $(f2 "$ratio2b")x of 2 bbolt nodes at once   $(verdict "$ratio2b >= 0.9")"
echo "                     (of 1 bbolt node alone:   $(f2 "$ratio2")x)"
echo "  database round trips per call <= 0.01:        $(f3 "$rt1") (1 node), $(f3 "$rt2") (2 nodes)   $(verdict "$rt1 <= 0.01 && $rt2 <= 0.01")"
echo "  added latency against bbolt, 5 ms backend:    p50 $(f3 "$add50") ms, p99 $(f3 "$add99") ms"
echo "  (autovacuum and autoanalyze runs on the database during the bench, counted in its transactions:" \
	"$(psql -X -q -d "$DSN" -Atc 'SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0) FROM pg_stat_user_tables'))"
