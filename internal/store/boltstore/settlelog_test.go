package boltstore

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/settlelog"
)

// walQuota is a quota with priced overage and no cap: the workload's
// calls are never refused.
var walQuota = billing.Product{ID: "wal-quota", BillingModel: billing.Subscription, MeasurementType: billing.PerToken,
	Quota: ptr(whole(100)), Overage: "allow", Price: 500_000}

// crash stops the store as kill -9 would leave it: what the log took is in
// its files (a killed process loses nothing it wrote), and whatever the
// applier had not applied yet is not in the database file.
func crash(t testing.TB, s *Store) {
	t.Helper()
	s.appendMu.Lock()
	s.closed.Store(true)
	s.appendMu.Unlock()
	close(s.stopApply)
	<-s.applyDone
	s.log.Close(0) // 0: keep every segment
	s.closeOnce.Do(func() { close(s.closing) })
	<-s.loopDone
	// The ledger's files are let go as a process exit does: what it has
	// is on disk already (Append syncs), no rollup log frame is written.
	s.led.Abandon()
	if err := s.db.Close(); err != nil {
		t.Fatal(err)
	}
}

// workload runs every kind of settlement at s and returns what it
// acknowledged: the units charged per service of user u1.
type workload struct {
	quota, prepaid, owner store.Account
	acked                 map[string]billing.Units // service -> units acknowledged
	entries               int
}

func runWorkload(t *testing.T, s *Store, crashed bool) *workload {
	t.Helper()
	w := &workload{acked: make(map[string]billing.Units)}
	if !crashed {
		w.quota = subscribe(t, s, "u1", "quota", walQuota, 0)
		w.prepaid = subscribe(t, s, "u1", "prepaid", prepaid, whole(1000))
	} else {
		w.quota = store.Account{UserID: "u1", ServiceID: "quota", Product: walQuota}
		w.prepaid = store.Account{UserID: "u1", ServiceID: "prepaid", Product: prepaid}
	}
	w.owner = store.Account{UserID: "owner", ServiceID: "quota", Free: true}
	var mu sync.Mutex
	ack := func(a store.Account, u billing.Units) {
		mu.Lock()
		if a.Free {
			w.acked["owner"] += u
		} else {
			w.acked[a.ServiceID] += u
		}
		w.entries++
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 15 {
				a := w.quota
				if (g+i)%2 == 0 {
					a = w.prepaid
				}
				res, err := s.Reserve(ctx, a, whole(1), t0)
				dec := res.Decision
				if err != nil || !dec.Allowed {
					t.Errorf("Reserve: %+v %v", dec, err)
					return
				}
				if e, err := s.Settle(ctx, res, whole(1), entryFor(a, 0, t0)); err != nil {
					t.Errorf("Settle: %v", err)
				} else {
					ack(a, e.Units)
				}
				e := entryFor(a, whole(2), t0)
				e.IdempotencyKey = fmt.Sprintf("k-%v-%d-%d", crashed, g, i)
				if _, err := s.Record(ctx, a, e, okResponse); err != nil {
					t.Errorf("Record: %v", err)
				} else {
					ack(a, whole(2))
				}
				id := fmt.Sprintf("job-%v-%d-%d", crashed, g, i)
				if res, err := s.CreateJobReserved(ctx, store.Job{ID: id, UserID: "u1", ServiceID: a.ServiceID,
					Status: store.JobPending, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}, a, whole(3), t0); err != nil || !res.Decision.Allowed {
					t.Errorf("CreateJobReserved: %+v %v", res.Decision, err)
					continue
				}
				if i%3 == 0 {
					continue // stays open, holding 3
				}
				ce := entryFor(a, whole(3), t0)
				ce.Source = store.SourceCompletion
				if _, err := s.CompleteJob(ctx, id, a, ce, complete(store.JobCompleted, "d"+id)); err != nil {
					t.Errorf("CompleteJob: %v", err)
				} else {
					ack(a, whole(3))
				}
			}
		})
	}
	wg.Wait()
	if _, err := s.Settle(ctx, store.Reservation{Account: w.owner}, whole(5), entryFor(w.owner, 0, t0)); err != nil {
		t.Fatal(err)
	}
	ack(w.owner, whole(5))
	if _, err := s.AddCredits(ctx, "u1", "prepaid", whole(7), t0); err != nil {
		t.Fatal(err)
	}
	return w
}

// checkAgainstLedger: the counters equal the ledger's sums, the balance is
// its top-ups less the ledger's costs, the open jobs' holds are what is
// held, and the ledger holds exactly the units acknowledged.
func checkAgainstLedger(t *testing.T, s *Store, acked map[string]billing.Units, topUps billing.Units, openJobs int) {
	t.Helper()
	all := ledger(t, s, store.LedgerFilter{})
	byService := make(map[string]billing.Units)
	var prepaidCost billing.Units
	seqs := make(map[uint64]bool)
	for i, e := range all {
		if seqs[e.Seq] || i > 0 && e.Seq <= all[i-1].Seq && e.Time.Equal(all[i-1].Time) {
			t.Errorf("ledger sequence %d repeated or out of order", e.Seq)
		}
		seqs[e.Seq] = true
		if e.ProductID == "" {
			byService["owner"] += e.Units
			continue
		}
		byService[e.ServiceID] += e.Units
		if e.ServiceID == "prepaid" {
			prepaidCost += e.Cost
		}
	}
	for svc, u := range acked {
		got := byService[svc]
		if got != u {
			t.Errorf("%s: ledger holds %s units, %s acknowledged", svc, got, u)
		}
	}
	q := stateOf(t, s, store.Account{UserID: "u1", ServiceID: "quota", Product: walQuota}, t0)
	p := stateOf(t, s, store.Account{UserID: "u1", ServiceID: "prepaid", Product: prepaid}, t0)
	if q.Used != byService["quota"] || p.Used != byService["prepaid"] {
		t.Errorf("counters used %s / %s, ledger %s / %s", q.Used, p.Used, byService["quota"], byService["prepaid"])
	}
	if p.Credits != topUps-prepaidCost {
		t.Errorf("balance %s, want top-ups %s less costs %s", p.Credits, topUps, prepaidCost)
	}
	if held := q.Reserved + p.Reserved; held != whole(3)*billing.Units(openJobs) {
		t.Errorf("%s held, want the %d open jobs' %s", held, openJobs, whole(3)*billing.Units(openJobs))
	}
}

// TestCrashLosesNothingAcknowledged: in both durability modes, a store
// killed with settlements appended but not applied to its file replays
// them at the next start: every acknowledged unit is in the ledger once,
// the counters equal the ledger, the open jobs still hold their units and
// the sync calls' holds are gone. A second crash and restart (the log
// replayed again over a file that has it) counts nothing twice.
func TestCrashLosesNothingAcknowledged(t *testing.T) {
	defer func(d time.Duration) { applyInterval = d }(applyInterval)
	applyInterval = time.Hour // nothing is applied before the crash
	for _, mode := range []settlelog.Mode{settlelog.Sync, settlelog.Write} {
		t.Run(mode.String(), func(t *testing.T) {
			path := storePath(t)
			s, err := OpenWith(path, Options{Durability: mode})
			if err != nil {
				t.Fatal(err)
			}
			w := runWorkload(t, s, false)
			// A hold in flight at the crash.
			if _, err := s.Reserve(ctx, w.quota, whole(4), t0); err != nil {
				t.Fatal(err)
			}
			crash(t, s)

			// The file has no ledger bucket; the log has it all.
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			db.View(func(tx *bolt.Tx) error {
				if tx.Bucket(bucketLedger) != nil {
					t.Errorf("a ledger bucket in the file")
				}
				return nil
			})
			db.Close()

			for round := range 3 {
				s = openAt(t, path)
				checkAgainstLedger(t, s, w.acked, whole(1007), 8*5)
				if round < 2 {
					crash(t, s)
				}
			}
			// The store carries on: new settlements after the replays.
			w2 := runWorkload(t, s, true)
			s.Close()
			s = openAt(t, path)
			sum := make(map[string]billing.Units)
			for k, v := range w.acked {
				sum[k] = v + w2.acked[k]
			}
			checkAgainstLedger(t, s, sum, whole(1014), 2*8*5)
			if segs, _ := filepath.Glob(path + ".*.settle"); len(segs) != 1 {
				t.Errorf("segments after a clean start: %v; want the new one only", segs)
			}
		})
	}
}

// TestReplayIdempotent: segments replayed over a file that already has
// them (the position it stores covers them) change nothing.
func TestReplayIdempotent(t *testing.T) {
	defer func(d time.Duration) { applyInterval = d }(applyInterval)
	applyInterval = time.Hour
	path := storePath(t)
	s := openAt(t, path)
	w := runWorkload(t, s, false)
	crash(t, s)
	segs, _ := filepath.Glob(path + ".*.settle")
	saved := make(map[string][]byte)
	for _, p := range segs {
		saved[p], _ = os.ReadFile(p)
	}
	s = openAt(t, path) // replays and removes the segments
	checkAgainstLedger(t, s, w.acked, whole(1007), 8*5)
	s.Close()
	for p, b := range saved { // put them back: a replay of the same records
		os.WriteFile(p, b, 0o600)
	}
	s = openAt(t, path)
	checkAgainstLedger(t, s, w.acked, whole(1007), 8*5)
}

// snapshotSynced copies the store as power loss would leave it now: the
// database file as of its last commit, the ledger directory as of its
// last append (every append is synced), and of each log segment only what
// an fdatasync covered.
func snapshotSynced(t *testing.T, s *Store) string {
	t.Helper()
	dir := t.TempDir()
	dst := filepath.Join(dir, filepath.Base(s.path))
	s.applyMu.Lock()
	err := s.db.View(func(tx *bolt.Tx) error { return tx.CopyFile(dst, 0o600) })
	if err == nil {
		err = s.led.Snapshot(LedgerDir(dst))
	}
	s.applyMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	for path, size := range s.log.SyncedSizes() {
		src, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		out, err := os.Create(filepath.Join(dir, filepath.Base(path)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.CopyN(out, src, size); err != nil {
			t.Fatal(err)
		}
		src.Close()
		out.Close()
	}
	return dst
}

// TestPowerLossSync: in sync mode an acknowledged settlement survives
// power loss: a copy of the store holding only what was fdatasync'd when
// the last call was answered opens with every acknowledged unit.
func TestPowerLossSync(t *testing.T) {
	defer func(d time.Duration) { applyInterval = d }(applyInterval)
	for _, every := range []time.Duration{time.Hour, time.Millisecond} { // applied or not
		applyInterval = every
		s := openTemp(t)
		w := runWorkload(t, s, false)
		copyPath := snapshotSynced(t, s)
		s.Close()
		c := openAt(t, copyPath)
		checkAgainstLedger(t, c, w.acked, whole(1007), 8*5)
	}
}

// TestPowerLossWrite: write mode acknowledges before the fdatasync; once
// the flush interval has passed, what was acknowledged is on stable
// storage.
func TestPowerLossWrite(t *testing.T) {
	s, err := OpenWith(storePath(t), Options{Durability: settlelog.Write, FlushInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w := runWorkload(t, s, false)
	s.appendMu.Lock()
	end := uint64(0)
	if n := len(s.queue); n > 0 {
		end = s.queue[n-1].pos
	}
	s.appendMu.Unlock()
	for i := 0; s.log.SyncedPosition() < end && s.applied.Load() < end; i++ {
		if i == 5000 {
			t.Fatal("never synced")
		}
		time.Sleep(time.Millisecond)
	}
	copyPath := snapshotSynced(t, s)
	c := openAt(t, copyPath)
	checkAgainstLedger(t, c, w.acked, whole(1007), 8*5)
}

// TestOpenRefusesBadLog: a file beside the store named like a segment of
// its log that is not one, or a log damaged before its end, stops Open
// with an error naming the file; the store file is left alone.
func TestOpenRefusesBadLog(t *testing.T) {
	path := storePath(t)
	s := openAt(t, path)
	subscribe(t, s, "u1", "svc", unlimited, 0)
	s.Close()
	foreign := path + ".00000000000000000000.settle"
	os.WriteFile(foreign, []byte("not a settlement log at all, but long enough"), 0o600)
	if _, err := Open(path); !errors.Is(err, settlelog.ErrNotOurs) || !strings.Contains(err.Error(), foreign) {
		t.Errorf("foreign segment: Open = %v", err)
	}
	os.Remove(foreign)

	defer func(d time.Duration) { applyInterval = d }(applyInterval)
	applyInterval = time.Hour
	s = openAt(t, path)
	a := store.Account{UserID: "u1", ServiceID: "svc", Product: unlimited}
	for range 3 {
		if _, err := s.Record(ctx, a, entryFor(a, whole(1), t0), okResponse); err != nil {
			t.Fatal(err)
		}
	}
	crash(t, s)
	segs, _ := filepath.Glob(path + ".*.settle")
	data, _ := os.ReadFile(segs[0])
	data[24+8] ^= 0xff // the first record
	os.WriteFile(segs[0], data, 0o600)
	if _, err := Open(path); !errors.Is(err, settlelog.ErrCorrupt) || !strings.Contains(err.Error(), "offset 24") {
		t.Errorf("damaged log: Open = %v", err)
	}
	if _, err := Open(filepath.Join(path, "under-a-file", "platform.db")); err == nil {
		t.Error("a store whose directory cannot be made opened")
	}
}

// TestTornTailLogged: a record torn at the end of the log (a crash while
// it was written, never acknowledged) is dropped at the next start with one
// log line naming the file; everything before it is replayed.
func TestTornTailLogged(t *testing.T) {
	defer func(d time.Duration) { applyInterval = d }(applyInterval)
	applyInterval = time.Hour
	path := storePath(t)
	s := openAt(t, path)
	a := subscribe(t, s, "u1", "svc", unlimited, 0)
	for range 3 {
		if _, err := s.Record(ctx, a, entryFor(a, whole(1), t0), okResponse); err != nil {
			t.Fatal(err)
		}
	}
	crash(t, s)
	segs, _ := filepath.Glob(path + ".*.settle")
	seg := segs[len(segs)-1]
	data, _ := os.ReadFile(seg)
	os.WriteFile(seg, data[:len(data)-5], 0o600) // the last record cut short
	s = openAt(t, path)
	core, logs := observer.New(zapcore.DebugLevel)
	s.SetLogger(zap.New(core))
	if n := logs.FilterLevelExact(zapcore.WarnLevel).Len(); n != 1 || !strings.Contains(logs.All()[0].Message, seg) {
		t.Errorf("log: %v; want one warning naming %s", logs.All(), seg)
	}
	if units, _ := sumUnits(ledger(t, s, store.LedgerFilter{})); units != whole(2) {
		t.Errorf("ledger holds %s units, want the 2 whose records are whole", units)
	}
	if st := stateOf(t, s, a, t0); st.Used != whole(2) {
		t.Errorf("used %s, want 2", st.Used)
	}
}
