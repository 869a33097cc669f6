package boltstore

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store"
)

// BenchmarkReserveSettle is the metering cost of one sync invoke: a hold
// committed before forwarding, a settlement committed after, by parallel
// callers sharing group commits.
func BenchmarkReserveSettle(b *testing.B) {
	s := openTemp(b)
	const users = 64
	accounts := make([]store.Account, users)
	for i := range accounts {
		accounts[i] = subscribe(b, s, fmt.Sprintf("u%d", i), "svc", quotaAllow, 0)
		accounts[i].Product.SpendingCap = nil
	}
	var next atomic.Int64
	b.SetParallelism(32) // a gateway has many calls in flight per CPU
	b.ReportAllocs()
	b.ResetTimer()
	defer reportCPU(b)()
	b.RunParallel(func(pb *testing.PB) {
		a := accounts[next.Add(1)%users]
		for pb.Next() {
			res, err := s.Reserve(ctx, a, whole(1), t0)
			dec := res.Decision
			if err != nil || !dec.Allowed {
				b.Errorf("Reserve: %+v, %v", dec, err)
				return
			}
			if _, err := s.Settle(ctx, res, whole(1), entryFor(a, 0, t0)); err != nil {
				b.Errorf("Settle: %v", err)
				return
			}
		}
	})
}

// BenchmarkKeyByHash is the key lookup of every invoke, in a store of 100k
// keys.
func BenchmarkKeyByHash(b *testing.B) {
	const n = 100_000
	s := openTemp(b)
	hashes := make([][32]byte, n)
	var wg sync.WaitGroup
	for w := range 64 { // parallel, so group commit fills the store quickly
		wg.Go(func() {
			for i := w; i < n; i += 64 {
				hashes[i] = keyHash(fmt.Sprintf("sk_%d", i))
				if err := s.CreateKey(ctx, store.KeyRecord{ID: fmt.Sprintf("key_%06d", i), Hash: hashes[i],
					UserID: fmt.Sprintf("u%d", i%1000), Created: t0}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, err := s.KeyByHash(ctx, hashes[(i*7919)%n]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkKeyByHashHot is the key lookup of callers that call again and
// again (64 keys, parallel): served by the read cache.
func BenchmarkKeyByHashHot(b *testing.B) {
	s := openTemp(b)
	hashes := make([][32]byte, 64)
	for i := range hashes {
		hashes[i] = keyHash(fmt.Sprintf("sk_%d", i))
		if err := s.CreateKey(ctx, store.KeyRecord{ID: fmt.Sprintf("key_%d", i), Hash: hashes[i],
			UserID: "u1", Roles: []string{"a", "b"}, Created: t0}); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for i := next.Add(1); pb.Next(); i++ {
			if _, err := s.KeyByHash(ctx, hashes[i%64]); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkRecord is a usage report: one durable write per call, shared
// commits across parallel callers.
func BenchmarkRecord(b *testing.B) {
	s := openTemp(b)
	a := subscribe(b, s, "u1", "svc", unlimited, 0)
	b.SetParallelism(32)
	b.ReportAllocs()
	b.ResetTimer()
	defer reportCPU(b)()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Record(ctx, a, entryFor(a, whole(1), t0), okResponse); err != nil {
				b.Errorf("Record: %v", err)
				return
			}
		}
	})
}

// BenchmarkGetSubscription is the subscription lookup of every invoke and
// report, in a store of 10k subscriptions.
func BenchmarkGetSubscription(b *testing.B) {
	const n = 10_000
	s := openTemp(b)
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Go(func() {
			for i := w; i < n; i += 64 {
				subscribe(b, s, fmt.Sprintf("u%d", i), "svc", quotaBlock, 0)
			}
		})
	}
	wg.Wait()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			if _, err := s.GetSubscription(ctx, fmt.Sprintf("u%d", (i*7919)%n), "svc"); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkLedgerCommit is one durable ledger write with no one to share
// the commit with: the floor of a write's latency, set by fsync.
func BenchmarkLedgerCommit(b *testing.B) {
	s := openTemp(b)
	a := subscribe(b, s, "u1", "svc", unlimited, 0)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Record(ctx, a, entryFor(a, whole(1), t0), okResponse); err != nil {
			b.Fatal(err)
		}
	}
}

// reportCPU starts counting the process's CPU time (user + system) and
// returns the function that reports it per op as cpu-us/op: the cost of a
// call, which wall time per op is not when callers wait for fdatasyncs.
func reportCPU(b *testing.B) func() {
	start := cpuTime()
	return func() { b.ReportMetric(float64(cpuTime()-start)/float64(time.Microsecond)/float64(b.N), "cpu-us/op") }
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkJobCreate is the store's part of one async invoke: a job
// created with its hold (CreateJobReserved) under a random UUID, as the
// gateway names its jobs, by parallel callers sharing the settlement log's
// fdatasyncs; the applier's commits to the file run meanwhile and count in
// cpu-us/op. Poll then reads jobs back by id (GetJob), from the file.
func BenchmarkJobCreate(b *testing.B) {
	s := openTemp(b)
	a := subscribe(b, s, "u1", "svc", quotaAllow, 0)
	a.Product.SpendingCap = nil
	b.SetParallelism(32)
	b.ReportAllocs()
	b.ResetTimer()
	defer reportCPU(b)()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			j := newJob(benchUUID(), t0.Add(time.Hour))
			j.Terms = &store.JobTerms{EndpointCost: whole(1)} // as the gateway creates every job
			if res, err := s.CreateJobReserved(ctx, j, a, whole(1), t0); err != nil || !res.Decision.Allowed {
				b.Errorf("CreateJobReserved: %+v, %v", res.Decision, err)
				return
			}
		}
	})
}

// BenchmarkJobPoll is a status poll of a job the file has (applied and
// not in the read cache's recent entries): GetJob by id, among 100k jobs.
func BenchmarkJobPoll(b *testing.B) {
	s := openTemp(b)
	a := subscribe(b, s, "u1", "svc", quotaAllow, 0)
	a.Product.SpendingCap = nil
	const n = 100_000
	ids := make([]string, n)
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 64 {
				ids[i] = benchUUID()
				if _, err := s.CreateJobReserved(ctx, newJob(ids[i], t0.Add(time.Hour)), a, whole(1), t0); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := s.applyAll(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		if _, err := s.GetJob(ctx, ids[i%n]); err != nil {
			b.Fatal(err)
		}
		i += 7919 // a prime: every id in turn, far apart
	}
}

// benchUUID is a random version 4 UUID, the form of the gateway's job ids.
func benchUUID() string {
	var u [16]byte
	rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	h := hex.EncodeToString(u[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
