package platformgw

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/store"
)

// A job whose forward failed is failed at once (failJob), which releases
// its hold. When the store cannot take that write (a disk hiccup, a
// PostgreSQL failover), the caller was told 502 but the job stayed PENDING
// and held its units until job_ttl (24 h by default): a prepaid caller's
// credits, or a quota, locked for a day. Such failures are now kept in a
// small queue and written again, with a doubling wait, by one goroutine
// that runs only while the queue holds something and stops with the
// handler (Cleanup). A completion the backend posts meanwhile wins: every
// attempt leaves a job that ended already as it is. A failure still not
// written when its job's deadline passes is left to the maintenance sweep,
// which fails the job then, as a restart leaves it (the queue is memory).

// Bounds of the retries: at most maxJobFailures failures wait (a store
// down for long under a flood of failed forwards; the rest expire at
// job_ttl), the first retry after failRetryFirst, then doubling up to
// failRetryMax, each attempt cut off after failAttemptTimeout.
var (
	maxJobFailures     = 4096
	failRetryFirst     = 200 * time.Millisecond
	failRetryMax       = 30 * time.Second
	failAttemptTimeout = 10 * time.Second
)

// jobFailure is a failure to write: the job, why it failed and when, and
// its deadline.
type jobFailure struct {
	jobs    store.Jobs // the store it was created in
	id      string
	reason  string
	at      time.Time // when the forward failed: the job's completedAt
	expires time.Time // past it the maintenance sweep fails the job
}

// jobFailures is a handler's queue of failures to write again. The zero
// value is ready; the goroutine starts with the first failure queued.
type jobFailures struct {
	mu      sync.Mutex
	pending []jobFailure
	running bool // a drain goroutine is running
	stopped bool // Cleanup: no goroutine starts again
	stop    chan struct{}
	ctx     context.Context // cancelled by Cleanup: an attempt under way ends
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// failJob marks a job the backend did not take as FAILED, unless the
// backend already finished it (a backend may post its completion before
// answering the forward). It runs to the end even when the caller has
// gone; a write the store refuses is queued and tried again. It reports
// whether the backend had completed the job (COMPLETED, charged) before:
// then the backend did take it, whatever it answered the forward.
func (h *Handler) failJob(job store.Job, reason string) (completed bool) {
	f := jobFailure{jobs: h.rt.Jobs(), id: job.ID, reason: reason, at: h.rt.Now().UTC(), expires: job.ExpiresAt}
	err := h.writeFailure(context.Background(), f, &completed)
	if err == nil {
		return completed
	}
	h.logger.Error("fail job: the store did not take it; trying again in the background",
		zap.String("request_id", f.id), zap.Error(err))
	h.jobFailures.add(h, f)
	return false
}

// writeFailure stores the job's failure. nil: done, the job is FAILED or
// ended otherwise (*completed set when its backend completed it); an
// error: worth trying again.
func (h *Handler) writeFailure(ctx context.Context, f jobFailure, completed *bool) error {
	_, err := f.jobs.UpdateJob(ctx, f.id, func(j *store.Job) error {
		*completed = j.Status == store.JobCompleted // fn may run again
		if j.Terminal() {
			return engine.ErrJobFinished
		}
		j.Status = store.JobFailed
		j.ErrorMessage = f.reason
		j.CompletedAt = f.at
		j.UpdatedAt = h.rt.Now().UTC()
		if j.UpdatedAt.Before(f.at) {
			j.UpdatedAt = f.at
		}
		return nil
	})
	switch {
	case err == nil:
		h.rt.CountJobState(store.JobFailed)
		return nil
	case errors.Is(err, engine.ErrJobFinished):
		return nil
	case errors.Is(err, store.ErrNotFound):
		h.logger.Warn("fail job: no such job", zap.String("request_id", f.id))
		return nil
	}
	return err
}

// add queues f and starts the goroutine that writes the queue if none
// runs. A handler cleaned up hands f to a live one (handOff).
func (q *jobFailures) add(h *Handler, f jobFailure) {
	q.mu.Lock()
	if q.stopped {
		q.mu.Unlock()
		handOff(h, []jobFailure{f})
		return
	}
	if len(q.pending) >= maxJobFailures {
		q.mu.Unlock()
		h.logger.Error("fail job: too many job failures wait for the store; this job stays PENDING and holds its units until its deadline",
			zap.String("request_id", f.id), zap.Time("expires_at", f.expires))
		return
	}
	q.pending = append(q.pending, f)
	if !q.running {
		if q.stop == nil {
			q.stop = make(chan struct{})
			q.ctx, q.cancel = context.WithCancel(context.Background())
		}
		q.running = true
		q.wg.Add(1)
		go q.run(h)
	}
	q.mu.Unlock()
}

// run writes the queued failures again, waiting failRetryFirst, then
// twice as long after each round in which the store refused one (up to
// failRetryMax), until the queue is empty or the handler is cleaned up.
func (q *jobFailures) run(h *Handler) {
	defer q.wg.Done()
	wait := failRetryFirst
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-q.stop:
			q.mu.Lock()
			q.running = false
			q.mu.Unlock()
			return
		case <-timer.C:
		}
		q.mu.Lock()
		batch := q.pending
		q.pending = nil
		q.mu.Unlock()

		var left []jobFailure
		for i, f := range batch {
			if q.ctx.Err() != nil {
				left = append(left, batch[i:]...)
				break
			}
			if !h.rt.Now().Before(f.expires) {
				// The sweep fails it with the expiry's message and
				// releases the hold.
				h.logger.Warn("fail job: the store did not take the failure before the job's deadline; the maintenance sweep fails it",
					zap.String("request_id", f.id))
				continue
			}
			ctx, cancel := context.WithTimeout(q.ctx, failAttemptTimeout)
			var completed bool // the caller has had its answer
			err := h.writeFailure(ctx, f, &completed)
			cancel()
			if err != nil {
				left = append(left, f)
				continue
			}
			h.logger.Info("failed job recorded after the store recovered", zap.String("request_id", f.id))
		}

		q.mu.Lock()
		q.pending = append(left, q.pending...)
		if len(q.pending) == 0 {
			q.running = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		if len(left) > 0 {
			wait = min(2*wait, failRetryMax)
		} else {
			wait = failRetryFirst // only failures queued meanwhile
		}
		timer.Reset(wait)
	}
}

// close stops the goroutine, waits for it, and returns what is still
// queued.
func (q *jobFailures) close() []jobFailure {
	q.mu.Lock()
	if q.stop != nil && !q.stopped {
		close(q.stop)
		q.cancel()
	}
	q.stopped = true
	q.mu.Unlock()
	q.wg.Wait()
	q.mu.Lock()
	left := q.pending
	q.pending = nil
	q.mu.Unlock()
	return left
}

// liveHandlers are the provisioned handlers not yet cleaned up: a reload
// provisions the new config's before it cleans up the old config's, so
// the failures an old handler still had queued go on in a new one.
var liveHandlers struct {
	sync.Mutex
	list []*Handler
}

func register(h *Handler) {
	liveHandlers.Lock()
	liveHandlers.list = append(liveHandlers.list, h)
	liveHandlers.Unlock()
}

func unregister(h *Handler) {
	liveHandlers.Lock()
	liveHandlers.list = slices.DeleteFunc(liveHandlers.list, func(o *Handler) bool { return o == h })
	liveHandlers.Unlock()
}

// handOff queues fs in the newest live handler. With none (the server is
// stopping), they are dropped: like after a restart, their jobs stay
// PENDING until their deadline, when the sweep fails them.
func handOff(from *Handler, fs []jobFailure) {
	if len(fs) == 0 {
		return
	}
	liveHandlers.Lock()
	var to *Handler
	if n := len(liveHandlers.list); n > 0 {
		to = liveHandlers.list[n-1]
	}
	liveHandlers.Unlock()
	if to == nil || to == from {
		ids := make([]string, len(fs))
		for i, f := range fs {
			ids[i] = f.id
		}
		from.logger.Warn("fail job: failures the store did not take are dropped at shutdown; these jobs stay PENDING until their deadline, when the maintenance sweep fails them",
			zap.Strings("request_ids", ids))
		return
	}
	for _, f := range fs {
		to.jobFailures.add(to, f)
	}
}

// Cleanup stops the retries of job failures, handing those still queued
// to the handler of the config that replaces this one.
func (h *Handler) Cleanup() error {
	unregister(h)
	handOff(h, h.jobFailures.close())
	return nil
}
