package platform

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/engine"
	"github.com/platformgw/gateway/internal/store"
)

// sharedOutcomes counts the invoke calls' outcomes (engine.OutcomeCounter)
// across reloads, as sharedCalls keeps the recent figures: a reload
// neither drops nor restarts the counts. The store it is flushed into is
// the pooled one (a reload never switches stores).
var sharedOutcomes = engine.NewOutcomeCounter()

// OutcomeFlushInterval is how often the counted outcomes are added to the
// store: at most this much of the non-billing counts is lost if the
// process is killed. A clean stop (and a reload that closes the store)
// flushes what is left.
var OutcomeFlushInterval = 5 * time.Second

// outcomeFlusher adds sharedOutcomes to a store every OutcomeFlushInterval
// until it is closed, then once more.
type outcomeFlusher struct {
	s      store.Outcomes
	logger *zap.Logger
	stop   chan struct{}
	done   chan struct{}
	failed bool // logged once until a flush succeeds again
}

// startOutcomeFlusher starts flushing into s, or returns nil for a store
// that keeps no outcomes.
func startOutcomeFlusher(s store.Store, logger *zap.Logger) *outcomeFlusher {
	o, ok := s.(store.Outcomes)
	if !ok {
		return nil
	}
	f := &outcomeFlusher{s: o, logger: logger, stop: make(chan struct{}), done: make(chan struct{})}
	go f.run()
	return f
}

func (f *outcomeFlusher) run() {
	defer close(f.done)
	t := time.NewTicker(OutcomeFlushInterval)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
			f.flush()
		}
	}
}

func (f *outcomeFlusher) flush() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := sharedOutcomes.Flush(ctx, f.s, time.Now())
	switch {
	case err != nil && !f.failed:
		f.failed = true
		f.logger.Warn("adding call outcomes to the store failed; they are kept and sent again", zap.Error(err))
	case err == nil && f.failed:
		f.failed = false
		f.logger.Info("call outcomes added to the store again")
	}
}

// close stops the loop and flushes what is left, before the store closes.
func (f *outcomeFlusher) close() {
	if f == nil {
		return
	}
	close(f.stop)
	<-f.done
	f.flush()
}
