// Package app is the example async backend: the handler of
// examples/asyncbackend, kept apart from its main so tests can run it
// against the real gateway.
//
// An async endpoint receives the gateway's envelope instead of the caller's
// body. The SDK's Verifier.Middleware checks its signature and hands over
// the job (CallerContext.Job). The backend accepts it at once with 202,
// which the caller sees as its own 202, and then works in the background:
// after a first step it posts progress (50%), after a second one the
// completion with the result and the units to charge, both through the
// SDK client and the progress_url and callback_url of the envelope.
//
//	POST /upper  upper-cases the text of the job, one unit per word
package app

import (
	"context"
	"encoding/json"
	"log"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/platformgw/gateway/sdk"
)

// Config is what the backend needs.
type Config struct {
	// Verifier checks the gateway's signature on the envelope.
	Verifier *sdk.Verifier
	// Client posts progress and completion; it signs with the service
	// secret and, with a reconciliation log, records every completion.
	Client *sdk.Client
	// Step is how long each of the two halves of the work takes, so that
	// a caller polling the job sees it RUNNING. Zero works at once.
	Step time.Duration
	// Logger receives one line per job and every failure to report
	// (default log.Default()).
	Logger *log.Logger
}

// Backend accepts jobs and works on them in the background. Shutdown waits
// for the jobs it accepted.
type Backend struct {
	cfg Config
	log *log.Logger

	// work ends when Shutdown gives up waiting: the jobs still running
	// then report themselves FAILED instead of vanishing.
	work   context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	closing bool
	running sync.WaitGroup
}

// New returns a Backend; serve its Handler.
func New(cfg Config) *Backend {
	b := &Backend{cfg: cfg, log: cfg.Logger}
	if b.log == nil {
		b.log = log.Default()
	}
	b.work, b.cancel = context.WithCancel(context.Background())
	return b
}

// Handler serves POST /upper behind the SDK's signature check.
func (b *Backend) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /upper", b.accept)
	return b.cfg.Verifier.Middleware(mux)
}

// Accepted is the backend's answer to the envelope. The gateway only looks
// at the status: 2xx accepts the job, anything else fails it.
type Accepted struct {
	RequestID string `json:"requestId"`
	Status    string `json:"status"`
}

func (b *Backend) accept(w http.ResponseWriter, r *http.Request) {
	cc, _ := sdk.FromContext(r.Context()) // always there behind the middleware
	if cc.Job == nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "this endpoint runs jobs; call it with /invoke/async")
		return
	}
	if !b.start() {
		// Refusing fails the job at once, which beats accepting work
		// that would be cut off.
		writeError(w, http.StatusServiceUnavailable, "service_unavailable", "the backend is shutting down")
		return
	}
	go b.run(cc)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	json.NewEncoder(w).Encode(Accepted{RequestID: cc.Job.RequestID, Status: "ACCEPTED"})
}

// start counts a job in, unless the backend is shutting down.
func (b *Backend) start() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closing {
		return false
	}
	b.running.Add(1)
	return true
}

// Shutdown stops accepting jobs and waits for the running ones to finish.
// When ctx ends first, the jobs still running are cancelled: each posts a
// FAILED completion, so its caller learns at once instead of at the job's
// expiry. Shutdown then still waits for those reports, and returns ctx's
// error.
func (b *Backend) Shutdown(ctx context.Context) error {
	b.mu.Lock()
	b.closing = true
	b.mu.Unlock()
	done := make(chan struct{})
	go func() {
		b.running.Wait()
		close(done)
	}()
	select {
	case <-done:
		b.cancel()
		return nil
	case <-ctx.Done():
		b.cancel()
		<-done
		return ctx.Err()
	}
}

// Time a report may take, retries included; shorter once Shutdown has
// stopped waiting for the jobs.
const (
	reportTimeout   = time.Minute
	shutdownTimeout = 10 * time.Second
)

// run works on one job and reports on it.
func (b *Backend) run(cc *sdk.CallerContext) {
	defer b.running.Done()
	job := cc.Job
	words := int64(len(strings.Fields(job.Payload)))
	if words == 0 {
		b.complete(cc, sdk.Completion{Status: sdk.StatusFailed, ErrorMessage: "the text is empty: there is nothing to upper-case"})
		return
	}
	if !b.pause() {
		b.abandon(cc)
		return
	}
	b.progress(cc, sdk.Progress{Stage: "upper-casing", PercentageComplete: 50})
	if !b.pause() {
		b.abandon(cc)
		return
	}
	units := sdk.WholeUnits(words)
	b.complete(cc, sdk.Completion{
		Result:      strings.ToUpper(job.Payload), // the server cuts a result over its cap (16 KiB by default)
		ContentType: "text/plain; charset=utf-8",
		Units:       &units,
	})
}

// pause stands for a step of real work; false when the backend is
// shutting down and the job should stop.
func (b *Backend) pause() bool {
	if b.cfg.Step <= 0 {
		return b.work.Err() == nil
	}
	t := time.NewTimer(b.cfg.Step)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-b.work.Done():
		return false
	}
}

// progress posts an update. A lost update is logged, not fatal: the job
// goes on, and the completion is what counts.
func (b *Backend) progress(cc *sdk.CallerContext, p sdk.Progress) {
	ctx, cancel := context.WithTimeout(b.work, reportTimeout)
	defer cancel()
	if _, err := b.cfg.Client.ReportProgress(ctx, cc.Job.ProgressURL, p); err != nil {
		b.log.Printf("ERROR job %s: progress %q not reported (the job goes on): %v", cc.Job.RequestID, p.Stage, err)
	}
}

// abandon fails a job the backend will not finish.
func (b *Backend) abandon(cc *sdk.CallerContext) {
	b.complete(cc, sdk.Completion{Status: sdk.StatusFailed, ErrorMessage: "the backend shut down before the job finished; start it again"})
}

// complete posts the completion. It runs even after Shutdown cancelled the
// work, so a job always ends with a report; the SDK retries it, and a
// repeat is charged once. When every attempt fails, the reconciliation log
// records the outcome as unknown.
func (b *Backend) complete(cc *sdk.CallerContext, c sdk.Completion) {
	timeout := reportTimeout
	if b.work.Err() != nil {
		timeout = shutdownTimeout
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(b.work), timeout)
	defer cancel()
	c.UserID = cc.UserID // for the reconciliation log
	c.Endpoint = "POST /upper"
	ack, err := b.cfg.Client.ReportCompletion(ctx, cc.Job.CallbackURL, c)
	if err != nil {
		// The caller sees the job PENDING or RUNNING until it expires
		// (job_ttl, 24 h by default): this line is how anyone learns why.
		b.log.Printf("ERROR job %s of %s: completion NOT reported, the job stays open on the gateway until it expires: %v",
			cc.Job.RequestID, cc.UserID, err)
		return
	}
	b.log.Printf("job %s of %s: %s", cc.Job.RequestID, cc.UserID, ack.Status)
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]string{"code": code, "message": message})
}
