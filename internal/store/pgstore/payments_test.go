package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/storetest"
)

var payT0 = time.Date(2024, 3, 20, 12, 0, 0, 0, time.UTC)

// TestPaymentsTwoNodes: two nodes on one database claim a record, apply
// a grant and a reversal, and expire grants at once: each happens once.
func TestPaymentsTwoNodes(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	nodes := []*Store{openNode(t, dsn, "a"), openNode(t, dsn, "b")}
	subscribe(t, nodes[0], "u1", "svc", "prepaid")
	subscribe(t, nodes[0], "u2", "svc", "prepaid")

	const n = 16 // calls per node
	var wg sync.WaitGroup
	bodies := make([][]byte, 2*n)
	errs := make([]error, 2*n)
	body := func(i int) []byte { return fmt.Appendf(nil, `{"n":%d}`, i) }
	for i := range 2 * n {
		wg.Go(func() { bodies[i], errs[i] = nodes[i%2].InsertPaymentRecord(ctx, "event", "evt_1", body(i), payT0) })
	}
	wg.Wait()
	storetest.CheckOneInsertWon(t, errs, bodies, body)

	g := store.CreditGrant{ID: "pi_1", UserID: "u1", ServiceID: "svc", Credits: units(100), GrantedAt: payT0,
		ExpiresAt: payT0.Add(time.Hour), Source: "stripe"}
	for i := range 2 * n {
		wg.Go(func() { _, errs[i] = nodes[i%2].GrantCredits(ctx, g) })
	}
	wg.Wait()
	storetest.CheckOneApplied(t, "grant", errs)
	for i := range 2 * n {
		wg.Go(func() {
			_, _, errs[i] = nodes[i%2].ReverseCredits(ctx, store.CreditReversal{ID: "re_1", GrantID: "pi_1", Credits: units(10), At: payT0})
		})
	}
	wg.Wait()
	storetest.CheckOneApplied(t, "reversal", errs)

	// u2: two grants, the older expiring; both nodes expire at once.
	for _, g := range []store.CreditGrant{
		{ID: "pi_2", UserID: "u2", ServiceID: "svc", Credits: units(10), GrantedAt: payT0, ExpiresAt: payT0.Add(time.Hour)},
		{ID: "pi_3", UserID: "u2", ServiceID: "svc", Credits: units(5), GrantedAt: payT0.Add(time.Second)},
	} {
		if _, err := nodes[1].GrantCredits(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := nodes[0].AddCredits(ctx, "u2", "svc", -units(3), payT0); err != nil { // spent, as far as the rule tells
		t.Fatal(err)
	}
	expired := make([][]store.CreditGrant, 2*n)
	for i := range 2 * n {
		wg.Go(func() { expired[i], errs[i] = nodes[i%2].ExpireCredits(ctx, payT0.Add(time.Hour)) })
	}
	wg.Wait()
	total := map[string]int{}
	for i := range 2 * n {
		if errs[i] != nil {
			t.Fatalf("ExpireCredits %d: %v", i, errs[i])
		}
		for _, g := range expired[i] {
			total[g.ID]++
		}
	}
	if total["pi_1"] != 1 || total["pi_2"] != 1 || len(total) != 2 {
		t.Fatalf("grants expired, by id, over every call: %v; want pi_1 and pi_2 once each", total)
	}
	for _, c := range []struct {
		user string
		want int64
	}{{"u1", 0}, {"u2", 5}} { // u1: 100 - 10 - 90; u2: 12 left, pi_3 has 5, pi_2 7
		for i, s := range nodes {
			if sub, err := s.GetSubscription(ctx, c.user, "svc"); err != nil || sub.Credits != units(c.want) {
				t.Errorf("node %d: %s balance %+v, %v; want %d", i, c.user, sub.Credits, err, c.want)
			}
		}
	}
	entries, _, err := nodes[0].ListAudit(ctx, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	actions := map[string]int{}
	for _, e := range entries {
		actions[e.Action]++
	}
	if actions["credits.grant"] != 3 || actions["credits.reverse"] != 1 || actions["credits.expire"] != 2 {
		t.Errorf("audit entries by action: %v", actions)
	}
}

// TestLeaseTwoNodes: the lease moves from a node that stalled past its
// expiry to the other; the stalled one is fenced, and the cursor outlives
// both nodes.
func TestLeaseTwoNodes(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b")
	const ttl = 10 * time.Second
	// Both ask at once: exactly one gets it.
	var wg sync.WaitGroup
	var la, lb store.Lease
	var ea, eb error
	wg.Go(func() { la, ea = a.TakeLease(ctx, "meter-shipper", "a", ttl, payT0) })
	wg.Go(func() { lb, eb = b.TakeLease(ctx, "meter-shipper", "b", ttl, payT0) })
	wg.Wait()
	if ea != nil || eb != nil || la.Held == lb.Held {
		t.Fatalf("both asked: a %+v, %v; b %+v, %v; want exactly one held", la, ea, lb, eb)
	}
	first, second := a, b
	held, other := la, lb
	if lb.Held {
		first, second, held, other = b, a, lb, la
	}
	if other.Holder != held.Holder || other.Epoch != held.Epoch {
		t.Errorf("the loser sees %+v, want the winner's %+v", other, held)
	}
	if err := first.PutLeaseCursor(ctx, "meter-shipper", held.Holder, held.Epoch, []byte("100"), payT0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	later := payT0.Add(ttl)
	loser := "a"
	if held.Holder == "a" {
		loser = "b"
	}
	took, err := second.TakeLease(ctx, "meter-shipper", loser, ttl, later)
	if err != nil {
		t.Fatal(err)
	}
	if !took.Held || took.Epoch != held.Epoch+1 || string(took.Cursor) != "100" {
		t.Fatalf("Take after expiry = %+v; want held, epoch %d, cursor 100", took, held.Epoch+1)
	}
	if err := first.PutLeaseCursor(ctx, "meter-shipper", held.Holder, held.Epoch, []byte("150"), later); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("the stalled node's PutLeaseCursor = %v, want ErrLeaseLost", err)
	}
	if err := second.PutLeaseCursor(ctx, "meter-shipper", took.Holder, took.Epoch, []byte("200"), later.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	first.Close()
	second.Close()
	c := openNode(t, dsn, "c")
	got, err := c.TakeLease(ctx, "meter-shipper", "c", ttl, later.Add(time.Hour))
	if err != nil || !got.Held || got.Epoch != took.Epoch+1 || string(got.Cursor) != "200" {
		t.Fatalf("a new node's Take = %+v, %v; want held, epoch %d, cursor 200", got, err, took.Epoch+1)
	}
}
