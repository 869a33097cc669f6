package engine

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store"
)

// memOutcomes is a store.Outcomes in memory that can lose its answers:
// lose makes the next AddOutcomes apply the batch and then fail, as a
// commit whose acknowledgement never arrived; down fails before applying.
type memOutcomes struct {
	mu         sync.Mutex
	rows       map[store.OutcomeKey]store.OutcomeRow
	seqs       map[string]uint64
	lose, down bool
}

func (m *memOutcomes) AddOutcomes(_ context.Context, b store.OutcomeBatch) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := store.CheckOutcomeBatch(b); err != nil {
		return false, err
	}
	if m.down {
		return false, store.ErrUnavailable
	}
	if m.seqs[b.Writer] >= b.Seq {
		return false, nil
	}
	m.seqs[b.Writer] = b.Seq
	for _, r := range b.Rows {
		sum := m.rows[r.OutcomeKey]
		sum.OutcomeKey = r.OutcomeKey
		sum.Add(r)
		m.rows[r.OutcomeKey] = sum
	}
	if m.lose {
		m.lose = false
		return true, errors.New("connection reset after the commit")
	}
	return true, nil
}

func (m *memOutcomes) ScanOutcomes(context.Context, store.OutcomeFilter, func(store.OutcomeRow) error) error {
	return nil
}

func (m *memOutcomes) PruneOutcomes(context.Context, time.Time) (int, error) { return 0, nil }

func newMemOutcomes() *memOutcomes {
	return &memOutcomes{rows: map[store.OutcomeKey]store.OutcomeRow{}, seqs: map[string]uint64{}}
}

func (m *memOutcomes) calls() (n int64, gateway, backend int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.rows {
		n += r.Calls
		for _, b := range r.Gateway.Buckets {
			gateway += b
		}
		for _, b := range r.Backend.Buckets {
			backend += b
		}
	}
	return n, gateway, backend
}

var hour0 = time.Date(2026, 11, 26, 13, 0, 0, 0, time.UTC)

// TestOutcomeCounterExact: calls counted from many goroutines while the
// counter is flushed, with flushes that fail before or after the store
// applied them, arrive in the store exactly once each.
func TestOutcomeCounterExact(t *testing.T) {
	c := NewOutcomeCounter()
	m := newMemOutcomes()
	const workers, per = 8, 5000
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				k := OutcomeCall{Hour: hour0.Unix() + int64(i%3)*3600, UserID: "u" + string(rune('a'+w%3)), ServiceID: "svc",
					EndpointID: "ep", Product: "basic", Outcome: store.Outcome2xx}
				var backend time.Duration
				if i%2 == 0 {
					backend = time.Millisecond
				}
				c.Count(k, 30*time.Microsecond, backend)
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-time.After(time.Millisecond):
			case <-stopped(&wg):
				return
			}
			m.mu.Lock()
			m.lose, m.down = i%3 == 1, i%5 == 2
			m.mu.Unlock()
			_ = c.Flush(context.Background(), m, hour0.Add(3*time.Hour)) // failures are retried below
		}
	}()
	wg.Wait()
	<-done
	m.mu.Lock()
	m.lose, m.down = false, false
	m.mu.Unlock()
	for range 3 {
		if err := c.Flush(context.Background(), m, hour0.Add(3*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	n, gw, be := m.calls()
	if n != workers*per || gw != n || be != n/2 {
		t.Errorf("stored %d calls, %d in the gateway histogram, %d in the backend's; want %d, %d, %d",
			n, gw, be, workers*per, workers*per, workers*per/2)
	}
	for i := range c.shards {
		if n := len(c.shards[i].cells); n != 0 {
			t.Errorf("cells of past hours kept after they were flushed: %d", n)
		}
	}
}

// stopped is closed once wg is done.
func stopped(wg *sync.WaitGroup) <-chan struct{} {
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	return ch
}

// TestOutcomeCounterRetry: a batch whose answer was lost is sent again
// with the same sequence number and counted once.
func TestOutcomeCounterRetry(t *testing.T) {
	c := NewOutcomeCounter()
	m := newMemOutcomes()
	k := OutcomeCall{Hour: hour0.Unix(), UserID: "u", ServiceID: "s", EndpointID: "e", Outcome: "rate_limited"}
	c.Count(k, time.Microsecond, 0)
	m.lose = true
	if err := c.Flush(context.Background(), m, hour0); err == nil {
		t.Fatal("a lost answer is an error")
	}
	c.Count(k, time.Microsecond, 0)
	if err := c.Flush(context.Background(), m, hour0); err != nil {
		t.Fatal(err)
	}
	if n, _, be := m.calls(); n != 2 || be != 0 {
		t.Errorf("stored %d calls (%d with a backend time), want 2 (0)", n, be)
	}
}

// TestOutcomeCountAllocs: counting a call seen before in this hour
// allocates nothing.
func TestOutcomeCountAllocs(t *testing.T) {
	c := NewOutcomeCounter()
	k := OutcomeCall{Hour: hour0.Unix(), UserID: "user-1", ServiceID: "svc", EndpointID: "ep", Product: "basic", Outcome: store.Outcome2xx}
	c.Count(k, time.Microsecond, time.Millisecond)
	if n := testing.AllocsPerRun(1000, func() { c.Count(k, 40*time.Microsecond, 3*time.Millisecond) }); n != 0 {
		t.Errorf("Count allocates %v times a call, want 0", n)
	}
}

// BenchmarkOutcomeCount is the per-call cost of counting an outcome
// (docs/performance.md): go test -run '^$' -bench OutcomeCount ./internal/engine/
func BenchmarkOutcomeCount(b *testing.B) {
	c := NewOutcomeCounter()
	keys := make([]OutcomeCall, 64)
	for i := range keys {
		keys[i] = OutcomeCall{Hour: hour0.Unix(), UserID: "user-" + string(rune('a'+i%26)) + string(rune('a'+i/26)),
			ServiceID: "svc", EndpointID: "ep", Product: "basic", Outcome: store.Outcome2xx}
	}
	b.ReportAllocs()
	cpu0 := processCPU()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			c.Count(keys[i%len(keys)], 40*time.Microsecond, 3*time.Millisecond)
			i++
		}
	})
	// CPU time, not wall time: what the budget of 2 µs a call is in, and
	// what a machine busy with other work does not inflate.
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
}
