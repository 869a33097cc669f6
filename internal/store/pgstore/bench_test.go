package pgstore

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
)

// BenchmarkSyncCall measures what a sync call costs the store: Reserve,
// then Settle of the units reserved, from 64 callers at once, on bbolt and
// on PostgreSQL (one node, and three nodes in this process sharing the
// callers), for a hard-limited subscription (a quota: served from leases)
// and one without a hard limit (only counted). It reports the database
// round trips per call.
//
//	go test -run '^$' -bench SyncCall -benchtime 20000x ./internal/store/pgstore/
func BenchmarkSyncCall(b *testing.B) {
	quota := billing.Product{ID: "q", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, Quota: ptr(billing.Whole(1_000_000_000))}
	open := billing.Product{ID: "open", BillingModel: billing.UsagePostpaid, MeasurementType: billing.PerRequest, Price: billing.Whole(1)}
	for _, p := range []billing.Product{quota, open} {
		for _, subs := range []int{1, 64} {
			b.Run("pg/"+p.ID+"/3node/"+strconv.Itoa(subs)+"subs", func(b *testing.B) {
				dsn := pgtest.DB(b)
				var ss []store.Store
				var pg []*Store
				for i := range 3 {
					s := openNode(b, dsn, "n"+strconv.Itoa(i), func(o *Options) { o.MaxConns = 8 })
					ss, pg = append(ss, s), append(pg, s)
				}
				benchCalls(b, ss, p, pg, subs)
			})
		}
		b.Run("bolt/"+p.ID, func(b *testing.B) {
			s, err := boltstore.Open(filepath.Join(b.TempDir(), "store.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			benchCalls(b, []store.Store{s}, p, nil, 1)
		})
		for _, nodes := range []int{1, 2} {
			for _, mode := range []string{"commit", "log"} {
				b.Run("pg-"+mode+"/"+p.ID+"/"+strconv.Itoa(nodes)+"node", func(b *testing.B) {
					dsn := pgtest.DB(b)
					var ss []store.Store
					var pg []*Store
					for i := range nodes {
						s := openNode(b, dsn, "n"+string(rune('a'+i)), func(o *Options) {
							o.MaxConns = 8
							if mode == "log" {
								o.LogDir = b.TempDir()
							}
							if os.Getenv("BENCH_LEASE_MAX") != "" {
								n, _ := strconv.Atoi(os.Getenv("BENCH_LEASE_MAX"))
								o.LeaseMax = billing.Whole(int64(n))
							}
						})
						ss, pg = append(ss, s), append(pg, s)
					}
					benchCalls(b, ss, p, pg, 1)
				})
			}
		}
	}
}

// benchCalls runs the calls from 64 callers spread over nodes, each caller
// on one of subs subscriptions.
func benchCalls(b *testing.B, nodes []store.Store, p billing.Product, pg []*Store, subs int) {
	ctx := context.Background()
	now := time.Now().UTC()
	accounts := make([]store.Account, subs)
	for i := range accounts {
		user := "u" + strconv.Itoa(i)
		if _, err := nodes[0].PutSubscription(ctx, store.Subscription{UserID: user, ServiceID: "svc", ProductID: p.ID, Status: "ACTIVE",
			StartedAt: now, UpdatedAt: now}); err != nil {
			b.Fatal(err)
		}
		accounts[i] = store.Account{UserID: user, ServiceID: "svc", Product: p}
	}
	// Committed transactions as the server counts them (pg_stat_database,
	// published by a backend at most once a second or when it goes idle
	// for 10s: read after waiting that out), with PGSTORE_BENCH_XACTS=1.
	xacts := func() int64 {
		if os.Getenv("PGSTORE_BENCH_XACTS") == "" || pg == nil {
			return 0
		}
		time.Sleep(11 * time.Second)
		var n int64
		if err := pg[0].pool.QueryRow(ctx, "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}
	x0 := xacts()
	var before, batches, calls, nanos, ships, shipped int64
	for _, s := range pg {
		before += s.RoundTrips()
		batches, calls, nanos = batches-s.settle.batches.Load(), calls-s.settle.calls.Load(), nanos-s.settle.nanos.Load()
		sh, n := s.shipStats()
		ships, shipped = ships-sh, shipped-n
	}
	var next atomic.Int64
	b.SetParallelism(32) // 64 callers with GOMAXPROCS 2
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(1))
		s, a := nodes[i%len(nodes)], accounts[i%len(accounts)]
		for pb.Next() {
			res, err := s.Reserve(ctx, a, billing.Whole(1), time.Now())
			dec := res.Decision
			if err != nil || !dec.Allowed {
				b.Errorf("reserve: %+v %v", dec, err)
				return
			}
			if _, err := s.Settle(ctx, res, billing.Whole(1), store.LedgerEntry{UserID: a.UserID, ServiceID: "svc", ProductID: p.ID,
				Source: store.SourceGateway}); err != nil {
				b.Errorf("settle: %v", err)
				return
			}
		}
	})
	b.StopTimer()
	if pg != nil {
		var after int64
		for _, s := range pg {
			// What the log took is shipped, and counted, before the end.
			if err := s.Flush(ctx); err != nil {
				b.Fatal(err)
			}
			after += s.RoundTrips()
			batches, calls, nanos = batches+s.settle.batches.Load(), calls+s.settle.calls.Load(), nanos+s.settle.nanos.Load()
			sh, n := s.shipStats()
			ships, shipped = ships+sh, shipped+n
		}
		if ships > 0 {
			b.ReportMetric(float64(shipped)/float64(ships), "calls/ship")
		}
		if x0 > 0 {
			b.ReportMetric(float64(xacts()-x0-2)/float64(b.N), "xacts/call")
		}
		b.ReportMetric(float64(after-before)/float64(b.N), "roundtrips/call")
		b.ReportMetric(float64(calls)/float64(max(batches, 1)), "calls/commit")
		b.ReportMetric(float64(nanos)/float64(max(batches, 1))/1e6, "ms/commit")
	}
}
