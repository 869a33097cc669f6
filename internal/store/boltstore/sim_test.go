package boltstore

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/vfs"
)

// The storage simulation (docs/reliability.md, "Deterministic simulation"):
// random workloads against the real store, with its settlement log and
// ledger directory on vfs.Sim (crashes that lose unsynced writes, torn
// writes, fsync errors, a full disk) and its bbolt file on the OS, checked
// against a model of what must hold after every recovery. A failure prints
// the seed and the shortest operation trace found; -sim.seed and -sim.ops
// replay it.
//
//	make sim SEED=7 DURATION=30s            seeds from 7 on for 30s
//	make sim SEED=7 OPS='call0 crash ...'   one trace
//
// A run is deterministic, bit for bit: the operations are drawn from the
// seed and run one at a time; the store's background work runs when the
// schedule says (the applier's timer is off and "apply" applies, the
// ledger's sealer is off and "seal" seals, the settlement log's writer runs
// in the goroutine that waits for a record: inlineBackground); the
// ledger's clock is the simulation's; and every fault, power failing in
// the middle of a file operation included, is a function of the seed, the
// file (below the run's directory) and its operation count.
// TestSimReplaysBitForBit runs seeds twice and compares the traces and the
// disks.

var (
	simSeed     = flag.Uint64("sim.seed", 0, "the storage simulation's first seed (0: a random one, printed)")
	simDuration = flag.Duration("sim.duration", 0, "run seeds from -sim.seed on for this long (0: only TestSim's CI slice)")
	simOps      = flag.String("sim.ops", "", "replay this operation trace (as a failure prints it) with -sim.seed")
	simLen      = flag.Int("sim.len", 120, "operations per seed")
	simProfile  = flag.String("sim.faults", "crash", "fault profile: crash (strict model) or damage (adds lost writes, bit flips, misreads)")
)

// The fault profiles, in parts per 10,000 operations.
var simProfiles = map[string]vfs.Faults{
	"crash":  {WriteErr: 40, NoSpace: 40, SyncErr: 60, Slow: 20, Crash: simMidCrash},
	"damage": {WriteErr: 40, NoSpace: 40, SyncErr: 60, Slow: 20, Crash: simMidCrash, LostWrite: 30, BitFlip: 3000, Misread: 30},
}

// simMidCrash is the rate of power failures during a file operation.
const simMidCrash = 60

// simLedgerSeal and simLogSegment are the ledger's seal size and the
// settlement log's segment size in a simulation: small, so that segments
// rotate, seal and go within a run.
const (
	simLedgerSeal = 2 << 10
	simLogSegment = 2 << 10
)

// simCISeeds are the CI slice's fixed seeds.
var simCISeeds = []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
	21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40}

// An operation of the workload.
type simOp struct {
	kind string // call, report, job, complete, credit, apply, seal, prune, restart, crash
	arg  int    // the account (call, report, job, credit), which open job (complete)
}

func (o simOp) String() string {
	if o.kind == "apply" || o.kind == "seal" || o.kind == "prune" || o.kind == "restart" || o.kind == "crash" {
		return o.kind
	}
	return o.kind + strconv.Itoa(o.arg)
}

func parseOps(s string) ([]simOp, error) {
	var ops []simOp
	for _, f := range strings.Fields(s) {
		i := strings.IndexAny(f, "0123456789")
		if i < 0 {
			ops = append(ops, simOp{kind: f})
			continue
		}
		n, err := strconv.Atoi(f[i:])
		if err != nil {
			return nil, fmt.Errorf("operation %q: %w", f, err)
		}
		ops = append(ops, simOp{kind: f[:i], arg: n})
	}
	return ops, nil
}

func formatOps(ops []simOp) string {
	s := make([]string, len(ops))
	for i, o := range ops {
		s[i] = o.String()
	}
	return strings.Join(s, " ")
}

// genOps draws n operations from seed: mostly calls and reports, jobs and
// their completions, credit grants, and now and then an apply, a seal of
// the ledger's full segments, a retention prune, a clean restart or a
// crash (between operations; power also fails during them, vfs.Faults.Crash).
func genOps(seed uint64, n int) []simOp {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	ops := make([]simOp, n)
	for i := range ops {
		switch p := r.IntN(100); {
		case p < 35:
			ops[i] = simOp{"call", r.IntN(2)}
		case p < 55:
			ops[i] = simOp{"report", r.IntN(2)}
		case p < 65:
			ops[i] = simOp{"job", r.IntN(2)}
		case p < 75:
			ops[i] = simOp{"complete", r.IntN(8)}
		case p < 80:
			ops[i] = simOp{"credit", 1}
		case p < 85:
			ops[i] = simOp{kind: "apply"}
		case p < 87:
			ops[i] = simOp{kind: "seal"}
		case p < 89:
			ops[i] = simOp{kind: "prune"}
		case p < 92:
			ops[i] = simOp{kind: "restart"}
		default:
			ops[i] = simOp{kind: "crash"}
		}
	}
	return ops
}

// simAccounts are the workload's two subscriptions: a quota with priced
// overage (never refused) and a prepaid balance.
var simAccounts = []store.Account{
	{UserID: "u1", ServiceID: "quota", Product: walQuota},
	{UserID: "u1", ServiceID: "prepaid", Product: prepaid},
}

// simModel is what the run acknowledged: what must hold after any crash
// and recovery.
type simModel struct {
	acked   map[string]bool // ledger rows (by their op id) acknowledged: present exactly once
	refused map[string]bool // rows whose write returned an error and is never retried: absent
	maybe   map[string]bool // failed settlements the store retries: at most once
	// unsure are the operations power failed during, by op id: their
	// caller never heard back, so either outcome is right; the check after
	// the recovery settles which it was (row there: acknowledged; not:
	// refused), and every later check holds the store to it.
	unsure  map[string]string // op id -> "report", "complete <job>" or "job <account>"
	topUps  billing.Units     // credit grants acknowledged
	maybeUp billing.Units     // credit grants that failed: counted or not, never twice (see check)
	open    []string          // open jobs acknowledged, in creation order
	jobAcct map[string]int
	pruned  time.Time // rows older may be gone (a retention prune)
}

// simRun is one run of a trace.
type simRun struct {
	t    testing.TB
	seed uint64
	disk *vfs.Sim
	dir  string
	path string
	// faults are the run's: on while it runs and recovers, off while
	// the model is checked.
	faults vfs.Faults
	s      *Store
	m      simModel
	now    time.Time
	step   int
	trace  []string // what each operation did, for the determinism check
	// recovered is the number of crashes the run has recovered from.
	recovered uint64
}

// simResult is a run's outcome: failed at step (the index of the
// operation after which a check failed), or not.
type simResult struct {
	err      error
	step     int
	detected bool // damage profile: the store refused to open, naming the damage
	trace    []string
	stats    vfs.SimStats
	ops      int
	// digest and db are hashes of the simulated disk and of what the
	// bbolt file holds, at the end of a run that got there.
	digest, db [32]byte
}

// runSim runs ops from seed under faults in a fresh directory.
func runSim(t testing.TB, seed uint64, ops []simOp, faults vfs.Faults) (res simResult) {
	dir, err := os.MkdirTemp(t.TempDir(), "sim")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	r := &simRun{t: t, seed: seed, disk: vfs.NewSim(seed, vfs.Faults{}), dir: dir, path: filepath.Join(dir, "platform.db"), now: t0,
		m: simModel{acked: map[string]bool{}, refused: map[string]bool{}, maybe: map[string]bool{}, unsure: map[string]string{},
			jobAcct: map[string]int{}}}
	r.disk.SetRoot(dir)
	r.faults = faults
	clock := ledgerNow
	ledgerNow = func() time.Time { return r.now }
	defer func() { ledgerNow = clock }()
	defer func() {
		if r.s != nil {
			r.disk.SetFaults(vfs.Faults{})
			r.s.Close()
		}
		res.trace, res.stats = r.trace, r.disk.Stats()
	}()
	r.disk.FS().MkdirAll(dir)
	if err := r.open(); err != nil {
		return simResult{err: fmt.Errorf("open a new store: %w", err)}
	}
	for _, a := range simAccounts {
		if _, err := r.s.PutSubscription(ctx, store.Subscription{UserID: a.UserID, ServiceID: a.ServiceID, ProductID: a.Product.ID,
			Status: "ACTIVE", UpdatedAt: t0.Add(-time.Hour)}); err != nil {
			return simResult{err: err}
		}
	}
	if _, err := r.s.AddCredits(ctx, "u1", "prepaid", whole(1000), t0); err != nil {
		return simResult{err: err}
	}
	r.m.topUps = whole(1000)
	r.disk.SetFaults(faults)
	for i, op := range ops {
		r.step = i
		res.ops++
		r.now = r.now.Add(time.Minute)
		crashes := r.disk.Crashes()
		detected, err := r.do(op, fmt.Sprintf("op%d", i), func() bool { return r.disk.Crashes() > crashes })
		if err == nil && !detected && r.disk.Crashes() > r.recovered {
			// Power failed during the operation: the process is gone.
			if r.s != nil {
				simCrash(r.s)
				r.s = nil
			}
			r.note("power failed during the operation")
			detected, err = r.recover()
		}
		if detected {
			return simResult{detected: true, step: i, ops: res.ops}
		}
		if err != nil {
			return simResult{err: fmt.Errorf("after operation %d (%s): %w", i, op, err), step: i, ops: res.ops}
		}
	}
	// The end is a clean restart: a sync call's hold whose settlement
	// failed stays in memory until the retry or the next start (§10.4).
	r.disk.SetFaults(vfs.Faults{})
	err = r.s.Close()
	r.s = nil
	if err == nil {
		err = r.open()
	}
	if err == nil {
		err = r.check()
	}
	if err != nil {
		return simResult{err: fmt.Errorf("at the end: %w", err), step: len(ops) - 1, ops: res.ops}
	}
	err = r.s.Close()
	r.s = nil
	var db [32]byte
	if err == nil {
		db, err = boltDigest(r.path)
	}
	if err != nil {
		return simResult{err: fmt.Errorf("at the end: %w", err), step: len(ops) - 1, ops: res.ops}
	}
	return simResult{ops: res.ops, digest: r.disk.Digest(), db: db}
}

// boltDigest hashes what the bbolt file at path holds: every bucket's
// name, keys and values, in order. Not its bytes: bbolt's page layout and
// transaction ids follow how the commit loop grouped writes, which is the
// timing of the loop's goroutine.
func boltDigest(path string) ([32]byte, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		return [32]byte{}, err
	}
	defer db.Close()
	h := sha256.New()
	put := func(b []byte) {
		h.Write(binary.AppendUvarint(nil, uint64(len(b))))
		h.Write(b)
	}
	var walk func(b *bolt.Bucket) error
	walk = func(b *bolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			put(k)
			if v == nil {
				put([]byte("bucket"))
				return walk(b.Bucket(k))
			}
			put(v)
			return nil
		})
	}
	err = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			put(name)
			return walk(b)
		})
	})
	return [32]byte(h.Sum(nil)), err
}

func (r *simRun) open() error {
	s, err := OpenWith(r.path, Options{FS: r.disk.FS()})
	if err != nil {
		return err
	}
	r.s = s
	return nil
}

// note adds a line to the trace; paths are given below the run's
// directory, so that two runs of a seed give the same trace.
func (r *simRun) note(format string, args ...any) {
	l := fmt.Sprintf("%d ", r.step) + fmt.Sprintf(format, args...)
	r.trace = append(r.trace, strings.ReplaceAll(l, r.dir, "$DIR"))
}

// do runs one operation and, after a restart or a crash, checks the model.
// detected: the store refused to start on damage it named (the damage
// profile's expected outcome of a bit flip). crashed says whether power
// has failed since the operation began: a write that failed then was cut
// off mid-way, its outcome unknown to its caller (simModel.unsure).
func (r *simRun) do(op simOp, id string, crashed func() bool) (detected bool, err error) {
	s := r.s
	switch op.kind {
	case "call":
		a := simAccounts[op.arg%2]
		res, err := s.Reserve(ctx, a, whole(1), r.now)
		if err != nil || !res.Decision.Allowed {
			r.note("call refused: %v", err)
			return false, nil
		}
		e := entryFor(a, whole(1), r.now)
		e.EndpointID = id
		if _, err := s.Settle(ctx, res, whole(1), e); err != nil {
			r.m.maybe[id] = true // the store retries a failed settlement
			r.note("settle failed: %v", err)
		} else {
			r.m.acked[id] = true
			r.note("settled")
		}
	case "report":
		a := simAccounts[op.arg%2]
		e := entryFor(a, whole(2), r.now)
		e.EndpointID, e.IdempotencyKey = id, id
		if _, err := s.Record(ctx, a, e, okResponse); err != nil && crashed() {
			r.m.unsure[id] = "report"
			r.note("report cut off: %v", err)
		} else if err != nil {
			r.m.refused[id] = true
			r.note("report failed: %v", err)
		} else {
			r.m.acked[id] = true
			r.note("reported")
		}
	case "job":
		a := simAccounts[op.arg%2]
		j := store.Job{ID: id, UserID: a.UserID, ServiceID: a.ServiceID, Status: store.JobPending, CreatedAt: r.now, ExpiresAt: r.now.Add(24 * time.Hour)}
		res, err := s.CreateJobReserved(ctx, j, a, whole(3), r.now)
		if err != nil && crashed() {
			r.m.unsure[id] = "job " + strconv.Itoa(op.arg%2)
			r.note("job cut off: %v", err)
			return false, nil
		}
		if err != nil || !res.Decision.Allowed {
			r.note("job refused: %v", err)
			return false, nil
		}
		r.m.open = append(r.m.open, id)
		r.m.jobAcct[id] = op.arg % 2
		r.note("job created")
	case "complete":
		if len(r.m.open) == 0 {
			r.note("no open job")
			return false, nil
		}
		jid := r.m.open[op.arg%len(r.m.open)]
		a := simAccounts[r.m.jobAcct[jid]]
		e := entryFor(a, whole(3), r.now)
		e.EndpointID, e.Source = id, store.SourceCompletion
		if _, err := s.CompleteJob(ctx, jid, a, e, complete(store.JobCompleted, "d"+jid)); err != nil && crashed() {
			r.m.unsure[id] = "complete " + jid
			r.note("complete %s cut off: %v", jid, err)
		} else if err != nil {
			r.m.refused[id] = true
			r.note("complete %s failed: %v", jid, err)
		} else {
			r.m.acked[id] = true
			r.m.open = slices.DeleteFunc(r.m.open, func(x string) bool { return x == jid })
			r.note("completed %s", jid)
		}
	case "credit":
		if _, err := s.AddCredits(ctx, "u1", "prepaid", whole(5), r.now); err != nil {
			r.m.maybeUp += whole(5)
			r.note("credit failed: %v", err)
		} else {
			r.m.topUps += whole(5)
			r.note("credited")
		}
	case "apply":
		r.note("apply: %v", s.applyAll() != nil)
	case "seal":
		r.note("seal: %v", s.led.SealPending() != nil)
	case "prune":
		before := r.now.Add(-20 * time.Minute)
		res, err := s.PruneLedger(ctx, before)
		if err == nil || res.Segments > 0 || crashed() {
			r.m.pruned = before
		}
		r.note("prune: %d segments, %v", res.Segments, err != nil)
	case "restart":
		err := s.Close()
		r.s = nil
		r.note("close: %v", err != nil)
		return r.recover()
	case "crash":
		r.disk.Crash()
		simCrash(s)
		r.s = nil
		r.note("crash")
		return r.recover()
	default:
		return false, fmt.Errorf("unknown operation %q", op.kind)
	}
	return false, nil
}

// simCrash lets go of a store whose disk crashed: its goroutines stop
// (their writes fail: the disk is gone) and the bbolt file is closed, as
// the process's exit would, keeping what bbolt committed.
func simCrash(s *Store) {
	s.appendMu.Lock()
	s.closed.Store(true)
	s.appendMu.Unlock()
	close(s.stopApply)
	<-s.applyDone
	s.log.Close(0)
	s.closeOnce.Do(func() { close(s.closing) })
	<-s.loopDone
	s.led.Abandon()
	s.db.Close()
}

// recover reopens the store (faults on: recovery runs on the same bad
// disk, and power may fail during it too: then it starts again on what
// that crash left) and checks the model (faults off: the check reads what
// recovery left, and its own writes must not fail).
func (r *simRun) recover() (detected bool, err error) {
	faults := r.faults
	for {
		crashes := r.disk.Crashes()
		err := r.open()
		if r.disk.Crashes() == crashes {
			if err != nil {
				if faults.BitFlip > 0 || faults.Misread > 0 || faults.LostWrite > 0 {
					r.note("open refused: %v", err)
					return true, nil
				}
				// A crash, a torn write or a failed sync must never stop a start.
				r.disk.SetFaults(vfs.Faults{})
				if err2 := r.open(); err2 != nil {
					return false, fmt.Errorf("the store does not open after recovery: %w", err)
				}
				r.note("open failed with faults, opened without: %v", err)
			}
			break
		}
		if err == nil {
			simCrash(r.s)
			r.s = nil
		}
		r.note("power failed during the recovery: %v", err)
	}
	r.recovered = r.disk.Crashes()
	r.disk.SetFaults(vfs.Faults{})
	defer r.disk.SetFaults(faults)
	return false, r.check()
}

// check compares the store with the model.
func (r *simRun) check() error {
	s := r.s
	var errs []error
	seen := map[string]int{}
	var rows []store.LedgerEntry
	if err := s.ScanLedger(ctx, store.LedgerFilter{}, func(e store.LedgerEntry) error {
		rows = append(rows, e)
		seen[e.EndpointID]++
		return nil
	}); err != nil {
		return fmt.Errorf("scan the ledger: %w", err)
	}
	// What power cut off mid-way happened or not; from now on the store
	// is held to what it did.
	for _, id := range slices.Sorted(maps.Keys(r.m.unsure)) {
		kind, arg, _ := strings.Cut(r.m.unsure[id], " ")
		switch kind {
		case "job":
			if _, err := s.GetJob(ctx, id); err == nil {
				n, _ := strconv.Atoi(arg)
				r.m.open = append(r.m.open, id)
				r.m.jobAcct[id] = n
			} else if !errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("read job %s: %w", id, err)
			}
		case "report", "complete":
			if seen[id] == 0 {
				r.m.refused[id] = true
				break
			}
			r.m.acked[id] = true
			if kind == "complete" {
				r.m.open = slices.DeleteFunc(r.m.open, func(x string) bool { return x == arg })
			}
		}
	}
	clear(r.m.unsure)
	for id, n := range seen {
		switch {
		case n > 1:
			errs = append(errs, fmt.Errorf("ledger row %s is there %d times", id, n))
		case r.m.refused[id]:
			errs = append(errs, fmt.Errorf("ledger row %s is there, and its write returned an error (unacknowledged counted)", id))
		case !r.m.acked[id] && !r.m.maybe[id]:
			errs = append(errs, fmt.Errorf("ledger row %s was never written", id))
		}
	}
	for id := range r.m.acked {
		if seen[id] == 0 && !r.prunable(id, rows) {
			errs = append(errs, fmt.Errorf("acknowledged ledger row %s is missing", id))
		}
	}
	// Counters and balances equal the rollups (which outlive pruned rows),
	// and the rollups equal the ledger while nothing was pruned.
	used := map[string]billing.Units{}
	var cost billing.Units
	if err := s.ScanRollups(ctx, store.RollupFilter{}, func(ro store.Rollup) error {
		used[ro.ServiceID] += ro.Units
		if ro.ServiceID == "prepaid" {
			cost += ro.Cost
		}
		return nil
	}); err != nil {
		return fmt.Errorf("scan the rollups: %w", err)
	}
	if r.m.pruned.IsZero() {
		led := map[string]billing.Units{}
		for _, e := range rows {
			led[e.ServiceID] += e.Units
		}
		for _, a := range simAccounts {
			if led[a.ServiceID] != used[a.ServiceID] {
				errs = append(errs, fmt.Errorf("%s: the rollups hold %s units, the ledger %s", a.ServiceID, used[a.ServiceID], led[a.ServiceID]))
			}
		}
	}
	var held billing.Units
	for i, a := range simAccounts {
		st, err := s.State(ctx, a, r.now)
		if err != nil {
			return err
		}
		if st.Used != used[a.ServiceID] {
			errs = append(errs, fmt.Errorf("%s: counter used %s, the rollups %s", a.ServiceID, st.Used, used[a.ServiceID]))
		}
		if i == 1 {
			// A credit grant that failed is in the balance or not; never
			// more than the model allows.
			lo, hi := r.m.topUps-cost, r.m.topUps+r.m.maybeUp-cost
			if st.Credits < lo || st.Credits > hi || (st.Credits-lo)%whole(5) != 0 {
				errs = append(errs, fmt.Errorf("prepaid balance %s, want acknowledged top-ups %s (+ up to %s that failed) less costs %s",
					st.Credits, r.m.topUps, r.m.maybeUp, cost))
			}
		}
		held += st.Reserved
	}
	if want := whole(3) * billing.Units(len(r.m.open)); held != want {
		errs = append(errs, fmt.Errorf("%s held, want the %d open jobs' %s", held, len(r.m.open), want))
	}
	return errors.Join(errs...)
}

// prunable says whether acknowledged row id may be gone by a retention
// prune: the run pruned, and id's op came before the cutoff (op i ran at
// t0 + i+1 minutes).
func (r *simRun) prunable(id string, _ []store.LedgerEntry) bool {
	if r.m.pruned.IsZero() {
		return false
	}
	i, err := strconv.Atoi(strings.TrimPrefix(id, "op"))
	return err == nil && t0.Add(time.Duration(i+1)*time.Minute).Before(r.m.pruned)
}

// shrink looks for a shorter trace that fails the same way (simFailure):
// the prefix up to the failing operation (which fails alike: a run is the
// same bit for bit, and later operations do not change earlier ones), then
// without single operations, for at most budget.
func shrink(t testing.TB, seed uint64, ops []simOp, failed simResult, faults vfs.Faults, budget time.Duration) []simOp {
	deadline := time.Now().Add(budget)
	want := simFailure(failed.err)
	best := ops[:failed.step+1]
	if res := runSim(t, seed, best, faults); res.err == nil || simFailure(res.err) != want {
		best = ops
	}
	for i := len(best) - 1; i >= 0 && time.Now().Before(deadline); i-- {
		try := slices.Delete(slices.Clone(best), i, i+1)
		if res := runSim(t, seed, try, faults); res.err != nil && simFailure(res.err) == want {
			best = try[:min(len(try), res.step+1)]
			i = min(i, len(best))
		}
	}
	return best
}

// simFailure is the kind of a run's failure: its first line, without
// where it happened, with numbers left out ("acknowledged ledger row op#
// is missing"). Shrinking keeps to one kind, so that the trace it prints
// shows the failure found, not another one.
func simFailure(err error) string {
	msg, _, _ := strings.Cut(err.Error(), "\n")
	if _, rest, ok := strings.Cut(msg, "): "); ok && strings.HasPrefix(msg, "after operation ") {
		msg = rest
	}
	msg = strings.TrimPrefix(msg, "at the end: ")
	var b strings.Builder
	for i, c := range msg {
		if c >= '0' && c <= '9' {
			if i == 0 || msg[i-1] < '0' || msg[i-1] > '9' {
				b.WriteByte('#')
			}
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

// simulate runs seed; a failure is reported with its shortest trace.
func simulate(t testing.TB, seed uint64, ops []simOp, faults vfs.Faults, doShrink bool) simResult {
	res := runSim(t, seed, ops, faults)
	if res.err == nil {
		return res
	}
	for _, l := range res.trace[max(0, len(res.trace)-12):] {
		t.Log("  ", l)
	}
	short := ops[:res.step+1]
	if doShrink {
		short = shrink(t, seed, ops, res, faults, time.Minute)
	}
	t.Errorf("storage simulation failed: seed %d, faults %s: %v\nshortest trace found (%d of %d operations):\n  make sim SEED=%d FAULTS=%s OPS='%s'",
		seed, *simProfile, res.err, len(short), len(ops), seed, *simProfile, formatOps(short))
	return res
}

// TestSim runs the CI slice (the fixed seeds, then one random seed it
// prints), or with -sim.duration seeds from -sim.seed on for that long, or
// with -sim.ops one trace; it prints the simulation's rate.
func TestSim(t *testing.T) {
	defer simSetup()()
	faults, ok := simProfiles[*simProfile]
	if !ok {
		t.Fatalf("-sim.faults %q: want crash or damage", *simProfile)
	}
	start := time.Now()
	var ops, runs, detected int
	var st vfs.SimStats
	add := func(res simResult) {
		ops += res.ops
		runs++
		if res.detected {
			detected++
		}
		st.Crashes += res.stats.Crashes
		st.MidCrashes += res.stats.MidCrashes
		st.Ops += res.stats.Ops
		st.SyncErrs += res.stats.SyncErrs
		st.WriteErrs += res.stats.WriteErrs + res.stats.NoSpaces
		st.TornPages += res.stats.TornPages
		st.BitFlips += res.stats.BitFlips
	}
	switch {
	case *simOps != "":
		trace, err := parseOps(*simOps)
		if err != nil {
			t.Fatal(err)
		}
		res := simulate(t, *simSeed, trace, faults, false)
		for _, l := range res.trace {
			t.Log(l)
		}
		add(res)
	case *simDuration > 0:
		seed := *simSeed
		if seed == 0 {
			seed = rand.Uint64() >> 16
		}
		t.Logf("seeds from %d on for %s", seed, *simDuration)
		for ; time.Since(start) < *simDuration && !t.Failed(); seed++ {
			add(simulate(t, seed, genOps(seed, *simLen), faults, true))
		}
	default:
		seeds := slices.Clone(simCISeeds)
		random := *simSeed
		if random == 0 {
			random = rand.Uint64() >> 16
		}
		t.Logf("the CI slice: seeds 1-%d and the random seed %d (make sim SEED=%d replays it)", len(simCISeeds), random, random)
		for _, seed := range append(seeds, random) {
			add(simulate(t, seed, genOps(seed, *simLen), faults, true))
			if t.Failed() {
				break
			}
		}
	}
	d := time.Since(start)
	t.Logf("%d runs, %d operations (%d file operations) in %s: %.0f operations/s; %d crashes (%d of them during a file operation), %d failed syncs, %d failed writes, %d torn pages, %d bit flips, %d runs refused to open on damage",
		runs, ops, st.Ops, d.Round(time.Millisecond), float64(ops)/d.Seconds(), st.Crashes, st.MidCrashes, st.SyncErrs, st.WriteErrs, st.TornPages, st.BitFlips, detected)
}

// simSetup sets the store up for the simulation and returns what puts it
// back: the applier's timer off (the simulation applies), the log's writer
// inline and the ledger's sealer off (the simulation seals), small
// segments, a probe of an unhealthy store at every hold and of a few bytes.
func simSetup() func() {
	ai, pi, pb, ib, ls, lb := applyInterval, probeInterval, probeBytes, inlineBackground, logSegmentBytes, ledgerSealBytes
	applyInterval, probeInterval, probeBytes, inlineBackground = time.Hour, 0, 16, true
	logSegmentBytes, ledgerSealBytes = simLogSegment, simLedgerSeal
	return func() {
		applyInterval, probeInterval, probeBytes, inlineBackground, logSegmentBytes, ledgerSealBytes = ai, pi, pb, ib, ls, lb
	}
}

// TestSimReplaysBitForBit: a seed run twice (each in its own temporary
// directory) gives the same trace, the same simulated disk, byte for
// byte, and the same records in the bbolt file, power failures during
// file operations included: nothing in a run depends on a goroutine's
// timing, a map's order or the wall clock.
func TestSimReplaysBitForBit(t *testing.T) {
	defer simSetup()()
	faults := simProfiles["crash"]
	var mid int64
	for _, seed := range []uint64{3, 25, 31} {
		ops := genOps(seed, *simLen)
		a, b := runSim(t, seed, ops, faults), runSim(t, seed, ops, faults)
		if a.err != nil || b.err != nil {
			t.Fatalf("seed %d: %v; %v", seed, a.err, b.err)
		}
		if !slices.Equal(a.trace, b.trace) {
			for i := range min(len(a.trace), len(b.trace)) {
				if a.trace[i] != b.trace[i] {
					t.Fatalf("seed %d: the traces part at line %d:\n  %s\n  %s", seed, i, a.trace[i], b.trace[i])
				}
			}
			t.Fatalf("seed %d: traces of %d and %d lines", seed, len(a.trace), len(b.trace))
		}
		if a.stats != b.stats {
			t.Errorf("seed %d: the disks counted differently:\n  %+v\n  %+v", seed, a.stats, b.stats)
		}
		if a.digest != b.digest {
			t.Errorf("seed %d: the simulated disks differ (%x, %x)", seed, a.digest[:8], b.digest[:8])
		}
		if a.db != b.db {
			t.Errorf("seed %d: the bbolt files hold different records (%x, %x)", seed, a.db[:8], b.db[:8])
		}
		mid += a.stats.MidCrashes
	}
	if mid == 0 {
		t.Error("no seed had power fail during a file operation: pick seeds that do")
	}
}

// TestSimFailureKind: shrinking tells failures apart by kind, not by
// where they happened or which rows they name.
func TestSimFailureKind(t *testing.T) {
	a := simFailure(errors.New("after operation 3 (crash): acknowledged ledger row op2 is missing\nmore"))
	b := simFailure(errors.New("after operation 1 (crash): acknowledged ledger row op0 is missing"))
	c := simFailure(errors.New("after operation 0 (crash): prepaid balance 0, want acknowledged top-ups 1000"))
	if a != b || a == c || a != "acknowledged ledger row op# is missing" {
		t.Errorf("kinds %q, %q, %q", a, b, c)
	}
}
