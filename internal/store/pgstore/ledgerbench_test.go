package pgstore

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// BenchmarkLedgerShipments measures the write rate of the ledger alone, as
// a fleet's shipments load it: transactions of 1,000 rows sent by COPY
// (copyData, as commitOnce sends a settlement log's shipment) from 1 and 4
// writers at once, each committed. It reports rows a second and, when the
// server runs on this machine, the CPU its backends spent a row (from
// /proc; docs/fleet.md, "Past one database").
//
//	go test -run '^$' -bench LedgerShipments -benchtime 200x ./internal/store/pgstore/
func BenchmarkLedgerShipments(b *testing.B) {
	for _, writers := range []int{1, 4} {
		b.Run(strconv.Itoa(writers)+"writers", func(b *testing.B) {
			s := openNode(b, pgtest.DB(b), "bench")
			ctx := context.Background()
			base := time.Now().UTC().Truncate(time.Hour)
			var seq atomic.Int64
			var cpu atomic.Int64
			var wg sync.WaitGroup
			var next atomic.Int64
			b.ResetTimer()
			start := time.Now()
			for range writers {
				wg.Go(func() {
					conn, err := s.pool.Acquire(ctx)
					if err != nil {
						b.Error(err)
						return
					}
					defer conn.Release()
					var pid int
					if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
						b.Error(err)
						return
					}
					t0 := backendTicks(pid)
					for next.Add(1) <= int64(b.N) {
						var l ledgerRows
						for range 1000 {
							q := seq.Add(1)
							e := store.LedgerEntry{Time: base.Add(time.Duration(q) * time.Microsecond), UserID: "user-42", ServiceID: "weather",
								EndpointID: "forecast", ProductID: "pro", RequestID: "0193a8f2-7c1e-7b3a-9f00-" + strconv.FormatInt(1e11+q, 10),
								Units: 1_000_000, Cost: 2_000_000, Source: store.SourceGateway, Seq: uint64(q), ID: "led_" + strconv.FormatInt(q, 10)}
							l.add(0, "bench:"+strconv.FormatInt(q, 10), q, e)
						}
						if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
							b.Error(err)
							return
						}
						if _, err := conn.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(l.copyData()), copyLedgerSQL); err != nil {
							b.Error(err)
							return
						}
						if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
							b.Error(err)
							return
						}
					}
					if t0 >= 0 {
						cpu.Add(backendTicks(pid) - t0)
					}
				})
			}
			wg.Wait()
			rows := float64(seq.Load())
			b.ReportMetric(rows/time.Since(start).Seconds(), "rows/s")
			if c := cpu.Load(); c > 0 {
				b.ReportMetric(float64(c)*1e4/rows, "server-µs/row") // clock ticks of 10 ms
			}
		})
	}
}

// backendTicks is a local server process's CPU time in clock ticks, -1
// when it cannot be read (a server elsewhere).
func backendTicks(pid int) int64 {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	if len(f) < 13 {
		return -1
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}
