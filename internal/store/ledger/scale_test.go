//go:build scale

// The ledger's scale benchmark (make bench-scale-ledger): grow a ledger to
// SCALE_LEDGER_ROWS rows (default 2,000,000; docs/performance.md has 10M
// and more) of sync calls spread over a year, SCALE_LEDGER_USERS users
// (default 100) with one subscription each, random UUIDv4 request ids,
// and report disk bytes a row, append rate, a user's month summary from
// rollups, a one-month export's rate, Open time after a crash (tail
// replay included) and memory.
//
//	SCALE_LEDGER_ROWS=10000000 go test -tags scale -run '^TestLedgerScale$' -v -timeout 60m ./internal/store/ledger
//
// SCALE_DIR keeps the ledger there (default: a temporary directory).
package ledger

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func procKiB(field string) int64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			return n
		}
	}
	return -1
}

func heapMiB() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapInuse) / (1 << 20)
}

func TestLedgerScale(t *testing.T) {
	n := envInt("SCALE_LEDGER_ROWS", 2_000_000)
	users := envInt("SCALE_LEDGER_USERS", 100)
	dir := os.Getenv("SCALE_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	year := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	step := int64(365*24*time.Hour) / int64(n)
	r := rand.New(rand.NewPCG(11, 12))
	userIDs := make([]string, users)
	for i := range userIDs {
		userIDs[i] = fmt.Sprintf("user-%05d", i)
	}

	l := open(t, dir, Options{})
	const batch = 10000
	es := make([]store.LedgerEntry, 0, batch)
	var uuid [16]byte
	start := time.Now()
	for i := range n {
		binary.LittleEndian.PutUint64(uuid[:], r.Uint64())
		binary.LittleEndian.PutUint64(uuid[8:], r.Uint64())
		uuid[6] = uuid[6]&0x0f | 0x40
		uuid[8] = uuid[8]&0x3f | 0x80
		seq := uint64(i + 1)
		es = append(es, store.LedgerEntry{Seq: seq, ID: defaultID(seq), Time: year.Add(time.Duration(int64(i) * step)),
			UserID: userIDs[r.IntN(users)], ServiceID: "weather", EndpointID: "forecast", ProductID: "basic",
			RequestID: formatUUID(uuid[:]), Units: billing.Whole(1), Cost: 1000, Source: store.SourceGateway})
		if len(es) == batch || i == n-1 {
			if err := l.Append(es, seq); err != nil {
				t.Fatal(err)
			}
			es = es[:0]
		}
	}
	appendDur := time.Since(start)
	if err := l.Seal(); err != nil {
		t.Fatal(err)
	}
	sealDur := time.Since(start)
	// A tail in the active segment, as a crash would leave it: no rollup
	// file covers it, Open replays it.
	tail := 200_000
	for i := range tail {
		seq := uint64(n + i + 1)
		es = append(es, store.LedgerEntry{Seq: seq, ID: defaultID(seq), Time: year.Add(365 * 24 * time.Hour).Add(time.Duration(i) * time.Millisecond),
			UserID: userIDs[0], ServiceID: "weather", EndpointID: "forecast", ProductID: "basic",
			RequestID: "5c7d2f1e-9a8b-4c3d-8e2f-1a2b3c4d5e6f", Units: billing.Whole(1), Source: store.SourceGateway})
		if len(es) == batch {
			if err := l.Append(es, seq); err != nil {
				t.Fatal(err)
			}
			es = es[:0]
		}
	}
	l.abandon()
	du := duBytes(t, dir)
	st := l.Stats()

	runtime.GC()
	heapBefore := heapMiB()
	start = time.Now()
	l = open(t, dir, Options{})
	openDur := time.Since(start)
	defer l.Close()
	heapOpen := heapMiB() - heapBefore
	rssOpen := procKiB("VmRSS")

	// A user's summary of one month, from the rollups.
	month := year.AddDate(0, 5, 0)
	var lat []time.Duration
	for i := range 50 {
		u := userIDs[i%users]
		t0 := time.Now()
		var calls int64
		var units billing.Units
		if err := l.ScanRollups(context.Background(), store.RollupFilter{UserID: u, ServiceID: "weather", From: month,
			To: month.AddDate(0, 1, 0)}, func(r store.Rollup) error {
			calls += r.Calls
			units += r.Units
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
		if calls == 0 {
			t.Fatalf("no calls for %s in %v", u, month)
		}
	}
	slices.Sort(lat)

	// One month's export, every user.
	t0 := time.Now()
	rows := 0
	if err := l.Scan(context.Background(), store.LedgerFilter{From: month, To: month.AddDate(0, 1, 0)}, func(store.LedgerEntry) error {
		rows++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	exportDur := time.Since(t0)

	t.Logf("| rows | %d (+%d in the active segment) over 2026, %d users |", n, tail, users)
	t.Logf("| disk (du) | %.1f MiB, %.1f bytes a row; %d segments |", float64(du)/(1<<20), float64(du)/float64(n+tail), st.Segments)
	t.Logf("| append | %.0f rows/s (batches of %d, fsync each); sealed in the background, all sealed after %.1f s |",
		float64(n)/appendDur.Seconds(), batch, sealDur.Seconds())
	t.Logf("| a user's month summary from rollups | median %v, max %v (%d rollups in all) |", lat[len(lat)/2], lat[len(lat)-1], l.Stats().Rollups)
	t.Logf("| one month's export (every user) | %d rows in %.2f s: %.0f rows/s |", rows, exportDur.Seconds(), float64(rows)/exportDur.Seconds())
	t.Logf("| Open after a crash | %.2f s, replaying %d tail rows into rollups |", openDur.Seconds(), tail)
	t.Logf("| memory after Open | heap %.1f MiB, RSS %.1f MiB, peak RSS of the run %.1f MiB |", heapOpen, float64(rssOpen)/1024, float64(procKiB("VmHWM"))/1024)
}
