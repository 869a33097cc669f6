package pgstore

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/storetest"
)

// copyRows sends l as a shipment does (copyData by COPY) in a transaction
// of its own, committed when the COPY went through.
func copyRows(t *testing.T, s *Store, l *ledgerRows) error {
	t.Helper()
	ctx := context.Background()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	tag, err := conn.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(l.copyData()), copyLedgerSQL)
	if err != nil {
		conn.Exec(ctx, "ROLLBACK")
		return err
	}
	if int(tag.RowsAffected()) != len(l.index) {
		t.Fatalf("COPY took %d rows of %d", tag.RowsAffected(), len(l.index))
	}
	_, err = conn.Exec(ctx, "COMMIT")
	return err
}

// A shipment's rows, encoded by the node in COPY's binary format, are in
// the ledger as sent: every column, times to the microsecond, and the
// entry as its JSON said, whatever its strings hold (quotes, backslashes,
// control bytes, HTML characters, multi-byte and invalid UTF-8, U+2028).
// A row already there refuses the whole COPY with a unique violation, and
// a row whose entry could not be encoded (NULL) with a not-null one;
// neither writes anything.
func TestShipmentCopyRows(t *testing.T) {
	s := openNode(t, newDatabase(t), "a")
	ctx := context.Background()
	r := rand.New(rand.NewPCG(5, 6))
	clean := func(x string) string { return strings.ReplaceAll(x, "\x00", "") } // jsonb takes no \u0000
	base := time.Now().UTC().Truncate(time.Second)
	var l ledgerRows
	sent := map[string]int{}
	for i := range 600 {
		e := storetest.RandEntry(r)
		e.ID, e.EndpointID, e.ProductID, e.RequestID = clean(e.ID), clean(e.EndpointID), clean(e.ProductID), clean(e.RequestID)
		e.Source, e.IdempotencyKey = clean(e.Source), clean(e.IdempotencyKey)
		// The columns hold ids as the gateway admits them: printable,
		// multi-byte included.
		e.UserID = []string{"user-1", "ünïcödé-日本", "u\"q'uote", strings.Repeat("x", 128)}[i%4]
		e.ServiceID = []string{"weather", "svc 🙂", "s/1"}[i%3]
		e.Time = base.Add(time.Duration(i)*time.Millisecond + 123456*time.Nanosecond).Truncate(time.Microsecond)
		if _, err := store.AppendLedgerEntryJSON(nil, &e); err != nil {
			e.OccurredAt = time.Time{} // a time RFC 3339 cannot hold: tested below
		}
		call := "a:" + strconv.Itoa(i)
		l.add(len(l.index), call, int64(1_000_000+i), e)
		sent[call] = i
	}
	if err := copyRows(t, s, &l); err != nil {
		t.Fatal(err)
	}
	rows, err := s.pool.Query(ctx, "SELECT seq, time, call_id, user_id, service_id, entry FROM ledger")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close() // a failure below must not keep the connection from the store's Close
	n := 0
	for rows.Next() {
		var seq int64
		var tm time.Time
		var call, user, service string
		var raw []byte
		if err := rows.Scan(&seq, &tm, &call, &user, &service, &raw); err != nil {
			t.Fatal(err)
		}
		i, ok := sent[call]
		if !ok {
			t.Fatalf("a row for call %q, never sent", call)
		}
		n++
		if seq != l.seqs[i] || !tm.Equal(l.times[i]) || user != l.users[i] || service != l.services[i] {
			t.Fatalf("row %d: seq %d time %v user %q service %q; sent %d %v %q %q", i, seq, tm, user, service,
				l.seqs[i], l.times[i], l.users[i], l.services[i])
		}
		got, err := decodeEntry(raw)
		if err != nil {
			t.Fatalf("row %d: entry %s: %v", i, raw, err)
		}
		want, err := decodeEntry(l.entries[i])
		if err != nil {
			t.Fatal(err)
		}
		if !sameEntry(got, want) {
			t.Fatalf("row %d: entry\n got %+v\nwant %+v", i, got, want)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != len(sent) {
		t.Fatalf("%d rows in the ledger, %d sent", n, len(sent))
	}

	count := func() (c int) {
		if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM ledger").Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// The same rows again, with one new one: refused whole.
	var again ledgerRows
	e := store.LedgerEntry{Time: base.Add(time.Hour), UserID: "user-1", ServiceID: "weather", Units: 1_000_000}
	again.add(0, "a:new", 2_000_000, e)
	again.add(1, "a:0", l.seqs[0], store.LedgerEntry{Time: l.times[0], UserID: l.users[0], ServiceID: l.services[0]})
	var pe *pgconn.PgError
	if err := copyRows(t, s, &again); !errors.As(err, &pe) || pe.Code != "23505" {
		t.Fatalf("a row already there: %v, want a unique violation", err)
	}
	// An entry that could not be encoded is NULL, which the column refuses.
	var bad ledgerRows
	bad.add(0, "a:bad", 3_000_000, store.LedgerEntry{Time: base, UserID: "user-1", ServiceID: "weather",
		OccurredAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)})
	if bad.entries[0] != nil {
		t.Fatal("an entry with a year-10000 time was encoded")
	}
	if err := copyRows(t, s, &bad); !errors.As(err, &pe) || pe.Code != "23502" {
		t.Fatalf("an entry that could not be encoded: %v, want a not-null violation", err)
	}
	if c := count(); c != len(sent) {
		t.Fatalf("%d rows after the refused copies, want %d", c, len(sent))
	}
}

// sameEntry compares entries with their times as instants.
func sameEntry(a, b store.LedgerEntry) bool {
	if !a.Time.Equal(b.Time) || !a.OccurredAt.Equal(b.OccurredAt) {
		return false
	}
	a.Time, b.Time, a.OccurredAt, b.OccurredAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	return a == b
}
