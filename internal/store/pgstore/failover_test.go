package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// fixedAddress is one address in front of a PostgreSQL server that can
// change (a failover manager moving a virtual IP): a TCP forwarder to the
// port in to.
type fixedAddress struct {
	ln    net.Listener
	to    atomic.Int64
	mu    sync.Mutex
	conns []net.Conn
}

func newFixedAddress(t *testing.T, port int) *fixedAddress {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &fixedAddress{ln: ln}
	p.to.Store(int64(port))
	t.Cleanup(func() { ln.Close(); p.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *fixedAddress) port() int { return p.ln.Addr().(*net.TCPAddr).Port }

func (p *fixedAddress) serve(c net.Conn) {
	up, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(int(p.to.Load())))
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, c, up)
	p.mu.Unlock()
	go func() { io.Copy(up, c); up.Close() }()
	io.Copy(c, up)
	c.Close()
}

// cut closes every connection through p.
func (p *fixedAddress) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// A settle log node (and a second one, settle commit) serving while its
// PostgreSQL primary dies mid-shipment (pg_ctl stop -m immediate) and a
// synchronous standby is promoted behind the same address: every call
// acknowledged is in the new primary's ledger exactly once (the shipment
// whose COMMIT went unanswered is recognised by its call ids), and no two
// entries carry the same ledger number.
func TestFailoverAtSameAddressShipsOnce(t *testing.T) {
	primary := pgtest.Cluster(t, clusterPort())
	// The standby's port, one free now.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	standbyPort := l.Addr().(*net.TCPAddr).Port
	l.Close()
	standby := primary.Standby(standbyPort, "pgstore_standby")
	primary.SyncStandby("pgstore_standby")
	primary.DB("pgstore")
	addr := newFixedAddress(t, primary.Port)
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/pgstore?sslmode=disable", addr.port())
	a := openNode(t, dsn, "a", func(o *Options) {
		o.LogDir, o.ShipInterval, o.LeaseTTL, o.LeaseMax = t.TempDir(), 5*time.Millisecond, time.Minute, units(50)
	})
	b := openNode(t, dsn, "b", func(o *Options) {
		o.LogDir, o.SettleCommit, o.LeaseTTL, o.LeaseMax = t.TempDir(), true, time.Minute, units(50)
	})
	subscribe(t, a, "u", "pp", "pp")
	if _, err := a.AddCredits(context.Background(), "u", "pp", units(1_000_000), time.Now()); err != nil {
		t.Fatal(err)
	}
	acct := store.Account{UserID: "u", ServiceID: "pp", Product: prepaidProduct(1)}

	var mu sync.Mutex
	acked := map[string]int{}
	var wg sync.WaitGroup
	load := func(stop chan struct{}) {
		for i := range 8 {
			s := a
			if i%2 == 1 {
				s = b
			}
			wg.Go(func() {
				ctx := context.Background()
				for {
					select {
					case <-stop:
						return
					default:
					}
					res, err := s.Reserve(ctx, acct, units(1), time.Now())
					if err != nil || !res.Decision.Allowed {
						time.Sleep(5 * time.Millisecond)
						continue
					}
					if _, err := s.Settle(ctx, res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "pp", ProductID: "pp",
						RequestID: res.ID, Source: store.SourceGateway}); err == nil || errorsIsPending(err) {
						mu.Lock()
						acked[res.ID]++
						mu.Unlock()
					}
				}
			})
		}
	}
	stop := make(chan struct{})
	load(stop)
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }
	for deadline := time.Now().Add(30 * time.Second); count() < 3000; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls acknowledged before the failover", count())
		}
	}
	// a takes a fresh block of ledger numbers just before the primary
	// dies, its shipments and b's batches in flight.
	a.ship.seqMu.Lock()
	a.ship.seqs = a.ship.seqs[:0]
	a.ship.seqMu.Unlock()
	first := a.ship.nextSeq(context.Background())
	primary.Kill()
	t.Logf("a's last block of ledger numbers from the old primary starts at %d", first)
	addr.cut()
	time.Sleep(500 * time.Millisecond)
	standby.Promote()
	addr.to.Store(int64(standbyPort))
	before := count()
	for deadline := time.Now().Add(60 * time.Second); count() < before+3000; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls acknowledged after the failover", count()-before)
		}
	}
	close(stop)
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); b.settle.waiting.Load() > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d settlements still wait", b.settle.waiting.Load())
		}
	}
	sdsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/pgstore?sslmode=disable", standbyPort)
	seen := map[string]int{}
	n := 0
	if err := a.ScanLedger(ctx, store.LedgerFilter{UserID: "u", ServiceID: "pp"}, func(e store.LedgerEntry) error {
		seen[e.RequestID]++
		n++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	missing, twice := 0, 0
	for id := range acked {
		switch seen[id] {
		case 0:
			missing++
		case 1:
		default:
			twice++
		}
	}
	t.Logf("%d calls acknowledged (%d after the failover), %d ledger entries", len(acked), len(acked)-before, n)
	if missing > 0 || twice > 0 {
		t.Errorf("%d acknowledged calls missing from the ledger, %d in it more than once", missing, twice)
	}
	if dup := pgtest.Query(t, sdsn, "SELECT count(*) - count(DISTINCT seq) FROM ledger"); dup != "0" {
		t.Errorf("%s ledger entries carry a ledger number another entry has", dup)
	}
}

func errorsIsPending(err error) bool { return errors.Is(err, store.ErrSettlementPending) }
