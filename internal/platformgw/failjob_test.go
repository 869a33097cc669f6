package platformgw

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
	"github.com/platformgw/gateway/internal/store/vfs"
)

// syncFailsOnce fails the first fdatasync after it is armed: one commit of
// the store fails, as on a disk hiccup, and the next succeeds.
type syncFailsOnce struct {
	vfs.FS
	armed atomic.Bool
}

type syncFailsOnceFile struct {
	vfs.File
	fs *syncFailsOnce
}

func (g *syncFailsOnce) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	f, err := g.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return syncFailsOnceFile{f, g}, nil
}

func (f syncFailsOnceFile) Datasync() error {
	if f.fs.armed.CompareAndSwap(true, false) {
		return errors.New("EIO (injected)")
	}
	return f.File.Datasync()
}

// failJobFixture is a store holding job-1 of u1 (quota 10, the job holding
// 8) and a handler serving from it.
type failJobFixture struct {
	s   *boltstore.Store
	h   *Handler
	a   store.Account
	job store.Job
	t0  time.Time
}

func newFailJobFixture(t *testing.T, fs vfs.FS, wrap func(store.Store) store.Store) *failJobFixture {
	t.Helper()
	s, err := boltstore.OpenWith(filepath.Join(t.TempDir(), "p.db"), boltstore.Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	t0 := time.Now().UTC()
	q := billing.Whole(10)
	p := billing.Product{ID: "basic", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest, Quota: &q}
	if _, err := s.PutSubscription(ctx, store.Subscription{UserID: "u1", ServiceID: "svc", ProductID: "basic", Status: "ACTIVE", UpdatedAt: t0.Add(-time.Hour)}); err != nil {
		t.Fatal(err)
	}
	a := store.Account{UserID: "u1", ServiceID: "svc", Product: p}
	job := store.Job{ID: "job-1", UserID: "u1", ServiceID: "svc", EndpointID: "ep", ProductID: "basic", Status: store.JobPending,
		CreatedAt: t0, UpdatedAt: t0, ExpiresAt: t0.Add(24 * time.Hour)}
	if res, err := s.CreateJobReserved(ctx, job, a, billing.Whole(8), t0); err != nil || !res.Decision.Allowed {
		t.Fatal(res, err)
	}
	var data store.Store = s
	if wrap != nil {
		data = wrap(s)
	}
	h := &Handler{}
	h.init(engine.New(engine.Runtime{Data: data}), zap.NewNop())
	t.Cleanup(func() { h.Cleanup() })
	return &failJobFixture{s: s, h: h, a: a, job: job, t0: t0}
}

// await polls until cond holds, for up to 5 s.
func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("after 5 s: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (f *failJobFixture) jobState(t *testing.T) (store.Job, billing.State) {
	t.Helper()
	j, err := f.s.GetJob(context.Background(), f.job.ID)
	if err != nil {
		t.Fatal(err)
	}
	st, err := f.s.State(context.Background(), f.a, f.t0)
	if err != nil {
		t.Fatal(err)
	}
	return j, st
}

// TestFailJobStoreErrorRetried: when the store refuses the write that
// fails a job whose forward failed (a disk hiccup), the failure is written
// once the store takes writes again, and the job's hold goes with it.
// Before, failJob tried once and only logged: the caller had its 502, the
// job stayed PENDING and its 8 units held until job_ttl (24 h), and with
// quota 10 the caller's next call of 3 was refused.
func TestFailJobStoreErrorRetried(t *testing.T) {
	g := &syncFailsOnce{FS: vfs.OS}
	f := newFailJobFixture(t, g, nil)
	g.armed.Store(true) // the disk hiccups once while the backend is refusing the job
	f.h.failJob(f.job, "the service backend refused the job (HTTP 503)")
	if g.armed.Load() {
		t.Fatal("the injected fdatasync failure was never hit")
	}
	await(t, "the job's failure is written once the store recovers", func() bool {
		j, _ := f.jobState(t)
		return j.Status == store.JobFailed
	})
	j, st := f.jobState(t)
	if j.ErrorMessage != "the service backend refused the job (HTTP 503)" || j.CompletedAt.IsZero() {
		t.Errorf("job %+v", j)
	}
	if st.Reserved != 0 || st.Used != 0 {
		t.Errorf("after the job failed: reserved %s, used %s; want nothing", st.Reserved, st.Used)
	}
	// The store lets holds through again after its probe (once a second).
	var res store.Reservation
	var err error
	await(t, "the store takes holds again", func() bool {
		res, err = f.s.Reserve(context.Background(), f.a, billing.Whole(3), f.t0)
		return !errors.Is(err, store.ErrUnavailable)
	})
	if err != nil || !res.Decision.Allowed {
		t.Errorf("the next call of 3 units with quota 10: %+v %v; want it allowed", res.Decision, err)
	}
	await(t, "the retry goroutine ends with its queue", func() bool {
		f.h.jobFailures.mu.Lock()
		defer f.h.jobFailures.mu.Unlock()
		return !f.h.jobFailures.running && len(f.h.jobFailures.pending) == 0
	})
}

// refusingJobs refuses every UpdateJob while down is set, as a store whose
// writes fail (a PostgreSQL failover); everything else goes through.
type refusingJobs struct {
	store.Store
	down  atomic.Bool
	tries atomic.Int64
}

func (r *refusingJobs) UpdateJob(ctx context.Context, id string, fn func(*store.Job) error) (store.Job, error) {
	r.tries.Add(1)
	if r.down.Load() {
		return store.Job{}, store.ErrUnavailable
	}
	return r.Store.UpdateJob(ctx, id, fn)
}

// TestFailJobRetryLeavesCompletion: a completion the backend posts while
// the job's failure waits for the store wins; the retry leaves it.
func TestFailJobRetryLeavesCompletion(t *testing.T) {
	var r *refusingJobs
	f := newFailJobFixture(t, nil, func(s store.Store) store.Store {
		r = &refusingJobs{Store: s}
		return r
	})
	r.down.Store(true)
	f.h.failJob(f.job, "the service backend did not answer in time")
	await(t, "a retry is refused too", func() bool { return r.tries.Load() >= 2 })
	// The backend completes the job (its completion route writes through
	// CompleteJob), charging 2 units; then the store takes writes again.
	_, err := f.s.CompleteJob(context.Background(), f.job.ID, f.a, store.LedgerEntry{UserID: "u1", ServiceID: "svc", Units: billing.Whole(2), Time: f.t0},
		func(j *store.Job) error {
			j.Status = store.JobCompleted
			j.CompletedAt = time.Now().UTC()
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	r.down.Store(false)
	await(t, "the queued failure is dropped once the store answers", func() bool {
		f.h.jobFailures.mu.Lock()
		defer f.h.jobFailures.mu.Unlock()
		return !f.h.jobFailures.running
	})
	j, st := f.jobState(t)
	if j.Status != store.JobCompleted || j.ErrorMessage != "" {
		t.Errorf("job %s %q: the backend's completion must stand", j.Status, j.ErrorMessage)
	}
	if st.Used != billing.Whole(2) || st.Reserved != 0 {
		t.Errorf("used %s reserved %s, want 2 and 0", st.Used, st.Reserved)
	}
}

// TestFailJobRetriesSurviveReload: a handler cleaned up (a config reload)
// stops its retry goroutine and hands what is queued to the handler that
// replaces it, which writes it once the store recovers. A handler cleaned
// up with no successor (the server stopping) drops it: the job stays
// PENDING until job_ttl, as after a restart.
func TestFailJobRetriesSurviveReload(t *testing.T) {
	// Only this test's handlers are live while it runs.
	liveHandlers.Lock()
	others := liveHandlers.list
	liveHandlers.list = nil
	liveHandlers.Unlock()
	t.Cleanup(func() {
		liveHandlers.Lock()
		liveHandlers.list = append(liveHandlers.list, others...)
		liveHandlers.Unlock()
	})
	var r *refusingJobs
	f := newFailJobFixture(t, nil, func(s store.Store) store.Store {
		r = &refusingJobs{Store: s}
		return r
	})
	old := f.h
	register(old)
	next := &Handler{}
	next.init(old.rt, zap.NewNop())
	register(next)
	t.Cleanup(func() { next.Cleanup() })

	r.down.Store(true)
	old.failJob(f.job, "the service backend could not be reached")
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}
	old.jobFailures.mu.Lock()
	running, left := old.jobFailures.running, len(old.jobFailures.pending)
	old.jobFailures.mu.Unlock()
	if running || left != 0 {
		t.Fatalf("after Cleanup: goroutine running %v, %d failures kept", running, left)
	}
	next.jobFailures.mu.Lock()
	moved := len(next.jobFailures.pending)
	next.jobFailures.mu.Unlock()
	if moved != 1 {
		t.Fatalf("the new handler has %d failures queued, want the old one's 1", moved)
	}
	r.down.Store(false)
	await(t, "the new handler writes the old one's failure", func() bool {
		j, _ := f.jobState(t)
		return j.Status == store.JobFailed
	})
	if _, st := f.jobState(t); st.Reserved != 0 {
		t.Errorf("reserved %s after the failure", st.Reserved)
	}

	// The last handler goes: nothing is handed on, no goroutine is left.
	job2 := f.job
	job2.ID = "job-2"
	if res, err := f.s.CreateJobReserved(context.Background(), job2, f.a, billing.Whole(1), f.t0); err != nil || !res.Decision.Allowed {
		t.Fatal(res, err)
	}
	r.down.Store(true)
	next.failJob(job2, "the service backend could not be reached")
	next.Cleanup()
	next.jobFailures.mu.Lock()
	running = next.jobFailures.running
	next.jobFailures.mu.Unlock()
	if running {
		t.Fatal("the last handler's goroutine runs after Cleanup")
	}
	r.down.Store(false)
	if j, _ := f.s.GetJob(context.Background(), "job-2"); j.Status != store.JobPending {
		t.Errorf("job-2 %s, want PENDING until its deadline", j.Status)
	}
}

// TestFailJobPastDeadlineLeftToSweep: a failure still queued at its job's
// deadline is dropped; the maintenance sweep fails the job.
func TestFailJobPastDeadlineLeftToSweep(t *testing.T) {
	var r *refusingJobs
	f := newFailJobFixture(t, nil, func(s store.Store) store.Store {
		r = &refusingJobs{Store: s}
		return r
	})
	r.down.Store(true)
	job := f.job
	job.ExpiresAt = time.Now().Add(300 * time.Millisecond)
	f.h.failJob(job, "the service backend could not be reached")
	await(t, "the retries stop at the job's deadline", func() bool {
		f.h.jobFailures.mu.Lock()
		defer f.h.jobFailures.mu.Unlock()
		return !f.h.jobFailures.running
	})
	if n := r.tries.Load(); n < 2 {
		t.Errorf("%d attempts before the deadline, want retries", n)
	}
}

// invokeCount reads platform_invokes_total for svc/job/async/outcome.
func invokeCount(t *testing.T, outcome string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	engine.SharedMetrics(reg)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "platform_invokes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["service"] == "svc" && labels["endpoint"] == "job" && labels["mode"] == "async" && labels["outcome"] == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestAsyncCallerGone: a caller that hangs up while its job is being
// forwarded (Caddy's reverse proxy writes 499 for the cancelled request)
// is no refusal of the backend's: the job fails saying the caller hung
// up, its hold is released, no WARN blames the backend, and the outcome
// is caller_gone, as for a sync call. Before, the job said "the service
// backend refused the job (HTTP 499)" and the outcome was backend_error.
// A 499 the backend itself answers, the caller still there, is a refusal.
func TestAsyncCallerGone(t *testing.T) {
	g := newTestGateway(t)
	g.rt.Outcomes = engine.NewOutcomeCounter()
	core, logs := observer.New(zapcore.DebugLevel)
	g.h.logger = zap.New(core)

	gone0, refused0 := invokeCount(t, "caller_gone"), invokeCount(t, "backend_error")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	proxy := &backend{fn: func(w http.ResponseWriter, r *http.Request) {
		cancel() // the caller hangs up mid-forward
		<-r.Context().Done()
		w.WriteHeader(statusClientClosed) // what reverse_proxy writes then
	}}
	r := httptest.NewRequest("POST", "/api/service/svc/endpoint/job/invoke/async", strings.NewReader(`{"q":1}`)).WithContext(ctx)
	r.Header.Set("Authorization", "Bearer "+g.keys["alice"])
	w := httptest.NewRecorder()
	if err := g.h.ServeHTTP(w, r, proxy); err != nil {
		t.Fatal(err)
	}
	if w.Code != statusClientClosed || errorCode(t, w) != "" {
		t.Errorf("caller gone: %d %s, want a bare 499 for the access log", w.Code, w.Body)
	}
	id := w.Header().Get("X-Platform-Request-ID")
	job, err := g.rt.Store().GetJob(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if job.Status != store.JobFailed || job.ErrorMessage != "the caller hung up before the service backend accepted the job" {
		t.Errorf("job %s %q", job.Status, job.ErrorMessage)
	}
	if st := g.state("alice", "basic"); st.Reserved != 0 || st.Used != 0 {
		t.Errorf("after the caller left: %+v, want nothing held or charged", st)
	}
	if n := logs.FilterMessage("backend refused async job").Len(); n != 0 {
		t.Errorf("%d WARN lines blame the backend for the caller's hang-up", n)
	}
	if d := invokeCount(t, "caller_gone") - gone0; d != 1 {
		t.Errorf("caller_gone counted %v times, want 1", d)
	}
	if d := invokeCount(t, "backend_error") - refused0; d != 0 {
		t.Errorf("backend_error counted %v times, want 0", d)
	}
	// In the hourly call outcomes it is a 4xx (the 499), as a sync
	// call's caller gone, not the gateway's service_error.
	st := g.rt.Store().(store.Outcomes)
	if err := g.rt.Outcomes.Flush(context.Background(), st, time.Now()); err != nil {
		t.Fatal(err)
	}
	outcomes := map[string]int64{}
	if err := st.ScanOutcomes(context.Background(), store.OutcomeFilter{}, func(r store.OutcomeRow) error {
		outcomes[r.Outcome] += r.Calls
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if outcomes[store.Outcome4xx] != 1 || len(outcomes) != 1 {
		t.Errorf("call outcomes %v, want one 4xx", outcomes)
	}

	// The backend's own 499, the caller still waiting: a refusal.
	g.at = g.at.Add(time.Minute) // a fresh rate-limit window
	w = g.invoke("alice", "POST", "job", true, &backend{fn: func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(statusClientClosed)
	}})
	if w.Code != http.StatusBadGateway || errorCode(t, w) != "service_error" {
		t.Errorf("the backend's 499: %d %s, want 502 service_error", w.Code, w.Body)
	}
	job, _ = g.rt.Store().GetJob(context.Background(), w.Header().Get("X-Platform-Request-ID"))
	if job.Status != store.JobFailed || job.ErrorMessage != "the service backend refused the job (HTTP 499)" {
		t.Errorf("job %s %q", job.Status, job.ErrorMessage)
	}
	if n := logs.FilterMessage("backend refused async job").Len(); n != 1 {
		t.Errorf("%d WARN lines for the backend's refusal, want 1", n)
	}
	if d := invokeCount(t, "backend_error") - refused0; d != 1 {
		t.Errorf("backend_error counted %v times, want 1", d)
	}
}
