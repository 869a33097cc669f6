package boltstore

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/store"
)

// TestCreditGrantsReplayedAfterCrash: grants, a reversal and an expiry
// acknowledged and only in the settlement log when the process dies come
// back at the next start, balance and grants together, each once.
func TestCreditGrantsReplayedAfterCrash(t *testing.T) {
	defer func(d time.Duration) { applyInterval = d }(applyInterval)
	applyInterval = time.Hour // nothing is applied before the crash
	defer func() { applyGrantsAtOnce = true }()
	applyGrantsAtOnce = false
	path := storePath(t)
	s := openAt(t, path)
	subscribe(t, s, "u1", "svc", prepaid, whole(5))
	g := store.CreditGrant{ID: "pi_1", UserID: "u1", ServiceID: "svc", Credits: whole(100), GrantedAt: t0,
		ExpiresAt: t0.Add(time.Hour), Source: "stripe"}
	if _, err := s.GrantCredits(ctx, g); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GrantCredits(ctx, store.CreditGrant{ID: "pi_2", UserID: "u1", ServiceID: "svc", Credits: whole(20),
		GrantedAt: t0.Add(time.Minute), Source: "stripe"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.ReverseCredits(ctx, store.CreditReversal{ID: "re_1", GrantID: "pi_1", Credits: whole(30), At: t0}); err != nil {
		t.Fatal(err)
	}
	// Balance 95: pi_2 has 20, so pi_1 has 75 of its 70 net: all 70 expire.
	if got, err := s.ExpireCredits(ctx, t0.Add(time.Hour)); err != nil || len(got) != 1 || got[0].Expired != whole(70) {
		t.Fatalf("ExpireCredits = %+v, %v", got, err)
	}
	// Each change applies what came before it (it reads the grants from
	// the file), so the last, the expiry, is only in the log.
	var onFile store.CreditGrant
	s.view(func(tx *bolt.Tx) (err error) { onFile, err = readGrant(tx, "pi_1"); return err })
	crash(t, s)

	s = openAt(t, path)
	sub, err := s.GetSubscription(ctx, "u1", "svc")
	if err != nil || sub.Credits != whole(25) {
		t.Fatalf("after the crash: %+v, %v; want a balance of 25 (5 + 100 + 20 - 30 - 70)", sub, err)
	}
	gs, err := s.ListCreditGrants(ctx, "u1", "svc")
	if err != nil || len(gs) != 2 || gs[0].Reversed != whole(30) || gs[0].Expired != whole(70) || gs[1].Credits != whole(20) {
		t.Fatalf("grants after the crash: %+v, %v", gs, err)
	}
	if _, err := s.GrantCredits(ctx, g); !errors.Is(err, store.ErrReplayed) {
		t.Errorf("Grant after the crash = %v, want ErrReplayed", err)
	}
	if _, _, err := s.ReverseCredits(ctx, store.CreditReversal{ID: "re_1", GrantID: "pi_1", Credits: whole(30), At: t0}); !errors.Is(err, store.ErrReplayed) {
		t.Errorf("Reverse after the crash = %v, want ErrReplayed", err)
	}
	if got, err := s.ExpireCredits(ctx, t0.Add(2*time.Hour)); err != nil || len(got) != 0 {
		t.Errorf("ExpireCredits after the crash = %+v, %v; want nothing", got, err)
	}
	entries, _, err := s.ListAudit(ctx, "", 100)
	if err != nil || len(entries) != 4 {
		t.Errorf("audit after the crash: %d entries (%v), want 4: two grants, a reversal, an expiry", len(entries), err)
	}
	if !onFile.ExpiredAt.IsZero() {
		t.Errorf("the test meant the expiry to be only in the log, but the file had it: %+v", onFile)
	}
	// A second restart applies nothing twice.
	s.Close()
	s = openAt(t, path)
	if sub, _ := s.GetSubscription(ctx, "u1", "svc"); sub.Credits != whole(25) {
		t.Errorf("after a second restart: balance %s, want 25", sub.Credits)
	}
}

// TestReversalOnlyInLog: a reversal acknowledged and only in the log when
// the process dies (its record adds what it took to the grant's reversed,
// grantChange.Reverse) is applied once at the next start, and once only
// after a second.
func TestReversalOnlyInLog(t *testing.T) {
	defer func(d time.Duration) { applyInterval = d }(applyInterval)
	applyInterval = time.Hour // nothing is applied before the crash
	defer func() { applyGrantsAtOnce = true }()
	applyGrantsAtOnce = false
	path := storePath(t)
	s := openAt(t, path)
	subscribe(t, s, "u1", "svc", prepaid, 0)
	if _, err := s.GrantCredits(ctx, store.CreditGrant{ID: "pi_1", UserID: "u1", ServiceID: "svc", Credits: whole(100),
		GrantedAt: t0, Source: "stripe"}); err != nil {
		t.Fatal(err)
	}
	if _, g, err := s.ReverseCredits(ctx, store.CreditReversal{ID: "re_1", GrantID: "pi_1", Credits: whole(30), At: t0}); err != nil || g.Reversed != whole(30) {
		t.Fatalf("ReverseCredits = %+v, %v", g, err)
	}
	var onFile store.CreditGrant
	s.view(func(tx *bolt.Tx) (err error) { onFile, err = readGrant(tx, "pi_1"); return err })
	if onFile.Reversed != 0 {
		t.Fatalf("the test meant the reversal to be only in the log, but the file had it: %+v", onFile)
	}
	crash(t, s)
	for _, when := range []string{"after the crash", "after a second restart"} {
		s = openAt(t, path)
		sub, err := s.GetSubscription(ctx, "u1", "svc")
		gs, gerr := s.ListCreditGrants(ctx, "u1", "svc")
		if err != nil || gerr != nil || sub.Credits != whole(70) || len(gs) != 1 || gs[0].Reversed != whole(30) {
			t.Errorf("%s: %+v (%v), grants %+v (%v); want a balance of 70, 30 reversed once", when, sub, err, gs, gerr)
		}
		s.Close()
	}
}

// TestCreditGrantOnlyInLog: a grant acknowledged and not applied when the
// process dies is granted at the next start, balance and grant.
func TestCreditGrantOnlyInLog(t *testing.T) {
	defer func(d time.Duration) { applyInterval = d }(applyInterval)
	applyInterval = time.Hour
	defer func() { applyGrantsAtOnce = true }()
	applyGrantsAtOnce = false
	path := storePath(t)
	s := openAt(t, path)
	subscribe(t, s, "u1", "svc", prepaid, 0)
	if err := s.applyAll(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GrantCredits(ctx, store.CreditGrant{ID: "pi_1", UserID: "u1", ServiceID: "svc", Credits: whole(10), GrantedAt: t0}); err != nil {
		t.Fatal(err)
	}
	var sub store.Subscription
	var grants int
	s.view(func(tx *bolt.Tx) (err error) {
		grants = tx.Bucket(bucketGrants).Stats().KeyN
		sub, err = s.readSub(tx, "u1", "svc")
		return err
	})
	if grants != 0 || sub.Credits != 0 {
		t.Fatalf("the file has the grant before the crash (%d grants, balance %s): the test tests nothing", grants, sub.Credits)
	}
	crash(t, s)
	s = openAt(t, path)
	if sub, err := s.GetSubscription(ctx, "u1", "svc"); err != nil || sub.Credits != whole(10) {
		t.Errorf("after the crash: %+v, %v; want a balance of 10", sub, err)
	}
	if gs, err := s.ListCreditGrants(ctx, "u1", "svc"); err != nil || len(gs) != 1 {
		t.Errorf("grants after the crash: %+v, %v", gs, err)
	}
}

// TestPaymentsBackedUp: a backup holds the payments data; restored, the
// store has it.
func TestPaymentsBackedUp(t *testing.T) {
	s := openTemp(t)
	subscribe(t, s, "u1", "svc", prepaid, 0)
	if _, err := s.GrantCredits(ctx, store.CreditGrant{ID: "pi_1", UserID: "u1", ServiceID: "svc", Credits: whole(10), GrantedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.InsertPaymentRecord(ctx, "customer", "u1", []byte(`{"id":"cus_1"}`), t0); err != nil {
		t.Fatal(err)
	}
	l, err := s.TakeLease(ctx, "shipper", "a", time.Minute, t0)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutLeaseCursor(ctx, "shipper", "a", l.Epoch, []byte("pos"), t0); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := s.Backup(&buf, nil); err != nil {
		t.Fatal(err)
	}
	to := filepath.Join(t.TempDir(), "restored.db")
	if _, err := Restore(&buf, to); err != nil {
		t.Fatal(err)
	}
	r := openAt(t, to)
	if sub, err := r.GetSubscription(ctx, "u1", "svc"); err != nil || sub.Credits != whole(10) {
		t.Errorf("restored balance: %+v, %v", sub, err)
	}
	if gs, err := r.ListCreditGrants(ctx, "", ""); err != nil || len(gs) != 1 {
		t.Errorf("restored grants: %+v, %v", gs, err)
	}
	if b, err := r.GetPaymentRecord(ctx, "customer", "u1"); err != nil || string(b) != `{"id":"cus_1"}` {
		t.Errorf("restored record: %q, %v", b, err)
	}
	if got, err := r.TakeLease(ctx, "shipper", "b", time.Minute, t0.Add(time.Hour)); err != nil || string(got.Cursor) != "pos" {
		t.Errorf("restored lease: %+v, %v", got, err)
	}
}
