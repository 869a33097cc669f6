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

	"github.com/platformgw/gateway/internal/pgtest"
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
	s := openNode(t, pgtest.DB(t), "a")
	ctx := context.Background()
	r := rand.New(rand.NewPCG(5, 6))
	clean := func(x string) string { return strings.ReplaceAll(x, "\x00", "") } // jsonb takes no \u0000
	base := time.Now().UTC().Truncate(time.Second)
	var l ledgerRows
	sent := map[string]int{}
	var entries []store.LedgerEntry
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
		entries = append(entries, e)
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
		// The entry column holds the rest: the row reads back as the
		// entry sent, its seq and id the row's.
		if bytes.Contains(raw, []byte(`"userId"`)) || bytes.Contains(raw, []byte(`"time"`)) {
			t.Fatalf("row %d: entry %s holds what its columns hold", i, raw)
		}
		got, err := rowEntry(raw, seq, tm, user, service)
		if err != nil {
			t.Fatalf("row %d: entry %s: %v", i, raw, err)
		}
		// As JSON carries it (invalid UTF-8 replaced), whole.
		full, err := store.AppendLedgerEntryJSON(nil, &entries[i])
		if err != nil {
			t.Fatal(err)
		}
		want, err := decodeEntry(full)
		if err != nil {
			t.Fatal(err)
		}
		want.Seq, want.ID = uint64(seq), "led_"+strconv.FormatInt(seq, 10)
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

// A row keeps its seq, time, user and service in columns and the rest of
// its entry in the entry column; rows written before kept the whole entry
// there. Both read back whole, alike, through ScanLedger, and a batch
// retried after a lost commit finds either (the lookup) and charges it
// once.
func TestLedgerRowsOfEitherForm(t *testing.T) {
	s := openNode(t, pgtest.DB(t), "a")
	ctx := context.Background()
	at := time.Now().UTC().Truncate(time.Microsecond)
	mk := func(i int) store.LedgerEntry {
		return store.LedgerEntry{Time: at.Add(time.Duration(i) * time.Millisecond), UserID: "user-1", ServiceID: "weather",
			EndpointID: "forecast", ProductID: "pro", RequestID: "req-" + strconv.Itoa(i), Units: 2_500_000,
			Cost: 1_000_000, Source: store.SourceGateway, OccurredAt: at.Add(-time.Second)}
	}
	// The old form, as an earlier version wrote it: the whole entry.
	old := mk(0)
	raw, err := store.AppendLedgerEntryJSON(nil, &old)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO ledger (seq, time, call_id, user_id, service_id, entry) VALUES ($1, $2, $3, $4, $5, $6)`,
		int64(41), old.Time, "a:old", old.UserID, old.ServiceID, raw); err != nil {
		t.Fatal(err)
	}
	// The new form, as a shipment writes it.
	var l ledgerRows
	l.add(0, "a:new", 42, mk(1))
	if !bytes.HasPrefix(l.entries[0], []byte(`{"endpointId":"forecast",`)) {
		t.Fatalf("a shipped entry: %s", l.entries[0])
	}
	if err := copyRows(t, s, &l); err != nil {
		t.Fatal(err)
	}
	var got []store.LedgerEntry
	if err := s.ScanLedger(ctx, store.LedgerFilter{UserID: "user-1"}, func(e store.LedgerEntry) error {
		got = append(got, e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("%d entries, want 2", len(got))
	}
	for i, seq := range []uint64{41, 42} {
		want := mk(i)
		want.Seq, want.ID = seq, "led_"+strconv.FormatUint(seq, 10)
		if !sameEntry(got[i], want) {
			t.Fatalf("entry %d:\n got %+v\nwant %+v", i, got[i], want)
		}
	}

	// A batch holding both calls again, with the lookup an attempt after a
	// lost commit makes: each is found, whole, and charged nothing more.
	batch := []*settlement{
		{callID: "a:old", free: true, units: old.Units, entry: mk(0)},
		{callID: "a:new", free: true, units: old.Units, entry: mk(1)},
	}
	if err := s.commitOnce(ctx, batch, true); err != nil {
		t.Fatal(err)
	}
	for i, st := range batch {
		if st.err != nil {
			t.Fatalf("settlement %d: %v", i, st.err)
		}
		if !sameEntry(st.out, got[i]) {
			t.Fatalf("settlement %d found\n %+v\nwant %+v", i, st.out, got[i])
		}
	}
	var n int
	if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM ledger").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("%d ledger rows after the batch again, want 2", n)
	}
}
