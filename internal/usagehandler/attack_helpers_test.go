package usagehandler

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/signing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
	"github.com/platformgw/gateway/internal/store/pgstore"
)

// Helpers of the outside attack run's probes of the billing paths a
// backend drives (reports, job progress and completion, estimates), each
// run on both stores: a real bbolt file and, when PostgreSQL is there,
// a real database.

// onBothStores runs probe against a flight server on the embedded store
// and on PostgreSQL (skipped, as pgtest skips, without a server).
func onBothStores(t *testing.T, probe func(t *testing.T, f *flightServer)) {
	// PostgreSQL's leases run on its own clock: the probes run at now.
	at := time.Now().UTC().Truncate(time.Second)
	t.Run("bbolt", func(t *testing.T) {
		st, err := boltstore.Open(filepath.Join(t.TempDir(), "platform.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		probe(t, newFlightServerOn(t, st, at))
	})
	t.Run("postgres", func(t *testing.T) {
		pg, err := pgstore.Open(context.Background(), pgstore.Options{DSN: pgtest.DB(t), NodeID: "n1"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pg.Close() })
		probe(t, newFlightServerOn(t, pg, at))
	})
}

// rawAnswer is an answer as sent, body untouched.
type rawAnswer struct {
	status int
	header http.Header
	body   string
}

// send posts body to path signed with secret at the server's clock (or
// with ts when not empty), the header pairs added, and returns the raw
// answer.
func (f *flightServer) send(path, body, secret, ts string, header ...string) rawAnswer {
	f.t.Helper()
	req, err := http.NewRequest("POST", f.url+path, strings.NewReader(body))
	if err != nil {
		f.t.Fatal(err)
	}
	if ts == "" {
		ts = signing.Timestamp(f.at)
	}
	if secret != "" {
		req.Header.Set(f.hd.Timestamp, ts)
		req.Header.Set(f.hd.Signature, signing.Sign([]byte(secret), []byte(body), []byte(ts)))
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return rawAnswer{status: resp.StatusCode, header: resp.Header, body: string(raw)}
}

// basicAccount is user's account under svc's product basic (a quota of
// 10 requests, overage blocked).
func basicAccount(user string) store.Account {
	return store.Account{UserID: user, ServiceID: "svc", Product: flightBasic}
}

// state is the account's billing state now.
func (f *flightServer) state(a store.Account) billing.State {
	f.t.Helper()
	st, err := f.st.State(context.Background(), a, f.at)
	if err != nil {
		f.t.Fatal(err)
	}
	return st
}

// ledger is user's ledger entries of svc.
func (f *flightServer) ledger(user string) []store.LedgerEntry {
	f.t.Helper()
	var out []store.LedgerEntry
	if err := f.st.ScanLedger(context.Background(), store.LedgerFilter{UserID: user, ServiceID: "svc"}, func(e store.LedgerEntry) error {
		out = append(out, e)
		return nil
	}); err != nil {
		f.t.Fatal(err)
	}
	return out
}

// openJob stores a PENDING job of user (subscribed to basic) on svc's
// endpoint e holding units, as an async invoke does, and returns its id.
func (f *flightServer) openJob(id, user string, units billing.Units) {
	f.t.Helper()
	res, err := f.st.CreateJobReserved(context.Background(), store.Job{ID: id, UserID: user, ServiceID: "svc", EndpointID: "e",
		ProductID: "basic", Status: store.JobPending, CreatedAt: f.at, UpdatedAt: f.at, ExpiresAt: f.at.Add(time.Hour),
		Terms: &store.JobTerms{EndpointCost: billing.Whole(1)}}, basicAccount(user), units, f.at)
	if err != nil || !res.Decision.Allowed {
		f.t.Fatalf("job %s: %+v %v", id, res.Decision, err)
	}
}
