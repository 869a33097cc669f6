package pgstore

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// serveFor calls on s for d, one unit a call, counting the calls
// answered (acknowledged, or pending for the database); a refusal or an
// unavailable store is tried again.
func serveFor(s *Store, a store.Account, d time.Duration) (acked int) {
	end := time.Now().Add(d)
	return serveWhile(s, a, func() bool { return time.Now().Before(end) })
}

// serveWhile is serveFor while more says so.
func serveWhile(s *Store, a store.Account, more func() bool) (acked int) {
	ctx := context.Background()
	for more() {
		res, err := s.Reserve(ctx, a, units(1), time.Now())
		if err != nil || !res.Decision.Allowed {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		// Pending: not written yet, charged once the database answers;
		// the call's answer is delivered.
		if _, err := s.Settle(ctx, res, units(1), store.LedgerEntry{UserID: a.UserID, ServiceID: a.ServiceID,
			ProductID: a.Product.ID, Source: store.SourceGateway}); err == nil || errors.Is(err, store.ErrSettlementPending) {
			acked++
		}
	}
	return acked
}

// PostgreSQL down for longer than lease_ttl while a node serves from its
// lease with `settle log`: the calls it acknowledged from its log consumed
// units its lease row holds. When the database is back that row has
// expired (the database's clock ran on); a sweep that gave it back before
// the node shipped its log handed those units to another node (the quota
// served twice over by them) and the node's charges, finding no lease
// row, were cut at the limit. No node sweeps until it has reached the
// database for lease_ttl again (sweepReady): the node ships first, every
// call charged in full, nothing served past the quota.
func TestDatabaseDownPastLeaseTTL(t *testing.T) { downPastLeaseTTL(t, 4*time.Second, false) }

// The same with the shortest lease_ttl the configuration takes (1s): the
// node's shipper, retrying every 2 s once the outage had lasted a few
// seconds, shipped its log up to 2 s after the database was back, while
// the other node's sweep came lease_ttl after it last found the database
// down, at most 1 s after it was back: the sweep gave the expired row back
// first, the other node served its 66 units again (1,066 calls on a quota
// of 1,000) and the shipped charges were floored past the limit. A test
// with lease_ttl 4 s had 1.2 s of that margin at worst, less a loaded
// machine's commit (it failed so, 66 calls past the quota). A waiting
// settlement is now tried again at least every tenth of lease_ttl
// (retryMax).
func TestDatabaseDownPastShortLeaseTTL(t *testing.T) { downPastLeaseTTL(t, time.Second, false) }

// The same on a `settle commit` node, whose settlements wait in its group
// commit (settler.loop), which retried every 2 s as the shipper did.
func TestSettleCommitDownPastShortLeaseTTL(t *testing.T) { downPastLeaseTTL(t, time.Second, true) }

// downPastLeaseTTL keeps the database down past ttl while node a serves
// from its lease (settle log, or commit), and starts it again just after
// a found it down writing the settlements (the longest wait for its next
// attempt); node b sweeps as soon as it answers and serves what it can.
func downPastLeaseTTL(t *testing.T, ttl time.Duration, commit bool) {
	failed := make(chan struct{}, 1)
	hook := func() {
		select {
		case failed <- struct{}{}:
		default:
		}
	}
	oldWait := settleWait
	if commit {
		settleFailed = hook
	} else {
		shipFailed = hook
	}
	t.Cleanup(func() { shipFailed, settleFailed, settleWait = nil, nil, oldWait }) // after the nodes' Close (cleanups run last first)
	c := pgtest.Cluster(t, clusterPort())
	dsn := c.DB("pgstore")
	a := openNode(t, dsn, "a", func(o *Options) {
		o.LogDir, o.ShipInterval, o.LeaseTTL, o.LeaseMax = t.TempDir(), 20*time.Millisecond, ttl, units(100)
		o.SettleCommit = commit
	})
	// waiting is what a acknowledged and has not written yet.
	waiting := func() int {
		if commit {
			return queued(a)
		}
		return a.Unshipped()
	}
	b := openNode(t, dsn, "b", func(o *Options) { o.LeaseTTL, o.LeaseMax = ttl, units(100) })
	subscribe(t, a, "u", "svc", "q")
	const quota = 1000
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(quota)}
	ackedA := 0
	for range 60 { // the lease's blocks grow
		call(t, a, acct)
		ackedA++
	}
	if err := a.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A usage report takes all the quota a's lease does not hold (a
	// refill of its lease in flight, on a loaded machine, lands first).
	a.refills.Wait()
	var taken int64
	if err := a.pool.QueryRow(context.Background(), "SELECT used + leased_units FROM allowances WHERE user_id = 'u'").Scan(&taken); err != nil {
		t.Fatal(err)
	}
	rest := units(quota) - billing.Units(taken)
	if _, err := a.Record(context.Background(), acct, store.LedgerEntry{UserID: "u", ServiceID: "svc", ProductID: "q",
		Units: rest, Source: store.SourceReport}, func(store.LedgerEntry, billing.State) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	reported := int(rest / units(1))
	call(t, a, acct) // a reads the allowance again, as its calls do
	ackedA++
	// and the subscription: the outage's calls go on with it as last read
	// for lease_ttl at most (a read of a moment ago, not the cache's).
	a.cache.dropSub("u", "svc")
	if _, err := a.getSubscription(context.Background(), "u", "svc"); err != nil {
		t.Fatal(err)
	}

	// a serves from its lease, acknowledged from its log (or answered
	// pending), until the lease's own deadline: from before the stop,
	// which on a loaded machine can take longer than a short lease_ttl's
	// lease has left.
	if commit {
		// A call in the outage answers pending soon (set here: a loaded
		// machine's commits before it may take longer).
		settleWait = 100 * time.Millisecond
	}
	var stopped atomic.Int64
	servedA := make(chan int, 1)
	go func() {
		servedA <- serveWhile(a, acct, func() bool {
			at := stopped.Load()
			return at == 0 || time.Since(time.Unix(0, at)) < ttl
		})
	}()
	c.Stop()
	stopped.Store(time.Now().UnixNano())
	ackedA += <-servedA
	outage := waiting()
	if outage == 0 {
		t.Fatal("nothing served from the lease with the database down")
	}
	// The lease rows expire on the database's clock, and a's shipper (or
	// group commit) retries at its longest interval (2 s once 3 s of
	// failures had doubled it, before retryMax).
	time.Sleep(max(ttl, 4*time.Second))
	select {
	case <-failed: // an old attempt
	default:
	}
	select {
	case <-failed:
	case <-time.After(10 * time.Second):
		t.Fatal("a made no attempt to write its settlements")
	}
	c.Start()
	// A sweep as soon as the database answers: before a's next shipment.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, err := b.sweepExpired(context.Background())
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the database is not back: %v", err)
		}
	}
	// b serves what it can meanwhile (its own sweeps, every second at
	// most, give the expired row back lease_ttl after b last found the
	// database down), a ships its log.
	ackedB := serveFor(b, acct, max(2*ttl, 4*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.Flush(ctx); err != nil {
		t.Fatalf("not shipped: %v", err)
	}
	for waiting() > 0 {
		if ctx.Err() != nil {
			t.Fatalf("%d settlements not written", waiting())
		}
		time.Sleep(20 * time.Millisecond)
	}
	var sum, claimed billing.Units
	cut := 0
	if err := a.ScanLedger(ctx, store.LedgerFilter{UserID: "u", ServiceID: "svc"}, func(e store.LedgerEntry) error {
		sum += e.Units
		if e.UnitsClaimed > 0 {
			cut++
			claimed += e.UnitsClaimed
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	served := ackedA + ackedB + reported
	t.Logf("a acknowledged %d (%d in the outage), b %d, reported %d; ledger %s units, %d charges cut", ackedA, outage, ackedB, reported, sum, cut)
	if served > quota {
		t.Errorf("%d calls served on a quota of %d", served, quota)
	}
	if sum != units(int64(served)) || cut > 0 {
		t.Errorf("%d calls served, the ledger charges %s units (%d charges cut, claiming %s)", served, sum, cut, claimed)
	}
	st, err := b.State(ctx, acct, time.Now())
	if err != nil || st.Used != sum {
		t.Errorf("counters %+v (%v), ledger %s", st, err, sum)
	}
}

// queued counts the settlements waiting in s's group commit.
func queued(s *Store) int {
	s.settle.pendMu.Lock()
	defer s.settle.pendMu.Unlock()
	n := 0
	for _, c := range s.settle.pending {
		n += c
	}
	return n
}

// A settle commit node closed (caddy stop, a reload that drops the store)
// while PostgreSQL is down, with calls served from its leases whose
// settlements wait for the database: Close keeps them in the node's
// settlement log (the settle log's), and once the database is back the
// node's next Open ships them, each call once by its id, and gives back
// the leases of the closed incarnation they came from. Before, Close made
// one last attempt and dropped them: served, never charged.
func TestSettleCommitCloseKeepsSettlements(t *testing.T) {
	c := pgtest.Cluster(t, clusterPort())
	dsn := c.DB("pgstore")
	dir := t.TempDir()
	commit := func(o *Options) {
		o.LogDir, o.SettleCommit, o.LeaseTTL, o.LeaseMax = dir, true, time.Minute, units(10)
	}
	a := openNode(t, dsn, "a", commit)
	ctx := context.Background()
	subscribe(t, a, "u", "svc", "q")
	subscribe(t, a, "u", "pp", "pp")
	if _, err := a.AddCredits(ctx, "u", "pp", units(100), time.Now()); err != nil {
		t.Fatal(err)
	}
	quota := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(50)}
	pre := store.Account{UserID: "u", ServiceID: "pp", Product: prepaidProduct(2)}
	for range 10 { // the leases' blocks grow to LeaseMax
		call(t, a, quota)
		call(t, a, pre)
	}
	if a.Unshipped() != 0 {
		t.Fatalf("settle commit: %d settlements in the log", a.Unshipped())
	}

	c.Stop()
	// Calls the leases cover are served; their settlements wait.
	var ress []store.Reservation
	for _, acct := range []store.Account{quota, pre} {
		for range 4 {
			res, err := a.Reserve(ctx, acct, units(1), time.Now())
			if err != nil || !res.Decision.Allowed {
				break
			}
			ress = append(ress, res)
		}
	}
	if len(ress) < 2 {
		t.Fatalf("%d calls admitted from the leases with the database down", len(ress))
	}
	errs := make(chan error, len(ress))
	for _, res := range ress {
		go func() {
			_, err := a.Settle(ctx, res, units(1), store.LedgerEntry{UserID: res.Account.UserID, ServiceID: res.Account.ServiceID,
				ProductID: res.Account.Product.ID, Source: store.SourceGateway})
			errs <- err
		}()
	}
	for deadline := time.Now().Add(5 * time.Second); queued(a) < len(ress); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d settlements queued", queued(a), len(ress))
		}
	}
	a.Close()
	for range ress {
		if err := <-errs; !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("a settlement the database never took answered %v, want ErrUnavailable", err)
		}
	}

	c.Start()
	want := map[string]int{"svc": 10, "pp": 10}
	for _, res := range ress {
		want[res.Account.ServiceID]++
	}
	for round := range 2 { // the second start finds nothing more to ship
		a2 := openNode(t, dsn, "a", commit)
		for _, acct := range []store.Account{quota, pre} {
			n, sum, cost, _ := ledgerOf(t, a2, acct)
			if n != want[acct.ServiceID] || sum != units(int64(n)) {
				t.Errorf("round %d, %s: %d entries of %s units; %d calls served", round, acct.ServiceID, n, sum, want[acct.ServiceID])
			}
			st, err := a2.State(ctx, acct, time.Now())
			if err != nil || st.Used != sum || st.Spend != cost {
				t.Errorf("round %d, %s: counters %+v (%v), ledger %s units %s cost", round, acct.ServiceID, st, err, sum, cost)
			}
			if st.Reserved != 0 || st.CreditsHeld != 0 {
				t.Errorf("round %d, %s: the closed incarnation's lease is still held: %+v", round, acct.ServiceID, st)
			}
			if acct.ServiceID == "pp" && st.Credits != units(100)-cost {
				t.Errorf("credits %s, want %s", st.Credits, units(100)-cost)
			}
		}
		a2.Close()
	}
}

// TestSettleCommitStoppingAnswersWaiting: a `settle commit` node whose
// database is down is told the process is stopping (Stopping, as the
// server's shutdown begins): the Settles waiting for their commits answer
// at once that their settlements are pending (the call is charged: its
// answer is delivered), and so does one made after, before the store
// closes. Close keeps them in the settlement log and the next start
// ships each once. Before, they waited for the database until the store
// closed (or settleWait), past a short grace_period, and their answers
// raced the process's exit (docs/fleet.md "At stop").
func TestSettleCommitStoppingAnswersWaiting(t *testing.T) {
	old := settleWait
	settleWait = time.Hour // only the stop answers them
	t.Cleanup(func() { settleWait = old })
	c := pgtest.Cluster(t, clusterPort())
	dsn := c.DB("pgstore")
	dir := t.TempDir()
	commit := func(o *Options) {
		o.LogDir, o.SettleCommit, o.LeaseTTL, o.LeaseMax = dir, true, time.Minute, units(10)
	}
	a := openNode(t, dsn, "a", commit)
	ctx := context.Background()
	subscribe(t, a, "u", "svc", "q")
	subscribe(t, a, "u", "pp", "pp")
	if _, err := a.AddCredits(ctx, "u", "pp", units(100), time.Now()); err != nil {
		t.Fatal(err)
	}
	quota := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(50)}
	pre := store.Account{UserID: "u", ServiceID: "pp", Product: prepaidProduct(2)}
	for range 10 { // the leases' blocks grow to LeaseMax
		call(t, a, quota)
		call(t, a, pre)
	}

	c.Stop()
	// Calls the leases cover are served; their settlements wait.
	var ress []store.Reservation
	for _, acct := range []store.Account{quota, pre} {
		for range 4 {
			res, err := a.Reserve(ctx, acct, units(1), time.Now())
			if err != nil || !res.Decision.Allowed {
				break
			}
			ress = append(ress, res)
		}
	}
	if len(ress) < 2 {
		t.Fatalf("%d calls admitted from the leases with the database down", len(ress))
	}
	settle := func(res store.Reservation) error {
		_, err := a.Settle(ctx, res, units(1), store.LedgerEntry{UserID: res.Account.UserID, ServiceID: res.Account.ServiceID,
			ProductID: res.Account.Product.ID, Source: store.SourceGateway})
		return err
	}
	waiting, after := ress[:len(ress)-1], ress[len(ress)-1]
	errs := make(chan error, len(waiting))
	for _, res := range waiting {
		go func() { errs <- settle(res) }()
	}
	for deadline := time.Now().Add(5 * time.Second); queued(a) < len(waiting); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d settlements queued", queued(a), len(waiting))
		}
	}
	a.Stopping()
	for range waiting {
		if err := <-errs; !errors.Is(err, store.ErrSettlementPending) {
			t.Errorf("a settlement waiting at the stop answered %v, want ErrSettlementPending", err)
		}
	}
	if err := settle(after); !errors.Is(err, store.ErrSettlementPending) {
		t.Errorf("a settlement made after the stop began answered %v, want ErrSettlementPending", err)
	}
	a.Close()

	c.Start()
	want := map[string]int{"svc": 10, "pp": 10}
	for _, res := range ress {
		want[res.Account.ServiceID]++
	}
	a2 := openNode(t, dsn, "a", commit)
	defer a2.Close()
	for _, acct := range []store.Account{quota, pre} {
		if n, sum, _, _ := ledgerOf(t, a2, acct); n != want[acct.ServiceID] || sum != units(int64(n)) {
			t.Errorf("%s: %d entries of %s units; %d calls served", acct.ServiceID, n, sum, want[acct.ServiceID])
		}
	}
}
