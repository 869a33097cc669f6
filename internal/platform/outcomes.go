package platform

import (
	"context"
	"os"
	"path/filepath"
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
// flushes what is left; what that last flush cannot add (the database
// unreachable, a full disk) is kept in a file next to the store and added
// at the next start (engine.(*OutcomeCounter).Keep).
var OutcomeFlushInterval = 5 * time.Second

// outcomeFlusher adds sharedOutcomes to a store every OutcomeFlushInterval
// until it is closed, then once more.
type outcomeFlusher struct {
	s      store.Outcomes
	keep   string // the file of the counts a stop could not add; "" keeps none
	logger *zap.Logger
	stop   chan struct{}
	done   chan struct{}
	failed bool // logged once until a flush succeeds again
}

// startOutcomeFlusher starts flushing into s, or returns nil for a store
// that keeps no outcomes. keep is the file the counts a stop could not add
// are kept in (outcomeKeepFile): what an earlier process kept there is
// added first, at once.
func startOutcomeFlusher(s store.Store, keep string, logger *zap.Logger) *outcomeFlusher {
	o, ok := s.(store.Outcomes)
	if !ok {
		return nil
	}
	f := &outcomeFlusher{s: o, keep: keep, logger: logger, stop: make(chan struct{}), done: make(chan struct{})}
	kept := 0
	if keep != "" {
		n, calls, err := sharedOutcomes.LoadKept(keep)
		switch {
		case err != nil:
			// Unreadable: set aside for the operator, never read again.
			bad := keep + ".bad"
			rerr := os.Rename(keep, bad)
			f.logger.Error("the call outcomes an earlier stop kept cannot be read; they are not added", zap.Error(err),
				zap.String("moved_to", bad), zap.NamedError("move_error", rerr))
		case n > 0:
			kept = n
			f.logger.Info("adding the call outcomes an earlier stop kept", zap.String("file", keep),
				zap.Int("batches", n), zap.Int64("calls", calls))
		}
	}
	go f.run(kept > 0)
	return f
}

// outcomeKeepFile is the file of the counts a stop could not add: in the
// node's settlement log directory for PostgreSQL, next to the file for
// bbolt.
func outcomeKeepFile(dirOrFile string, dir bool) string {
	if dir {
		return filepath.Join(dirOrFile, "call-outcomes.kept")
	}
	return dirOrFile + ".outcomes-kept"
}

func (f *outcomeFlusher) run(now bool) {
	defer close(f.done)
	if now {
		f.flush()
	}
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

func (f *outcomeFlusher) flush() error {
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
	return err
}

// close stops the loop and flushes what is left, before the store closes:
// one last attempt, and if the store cannot take the counts they are kept
// in f.keep for the next start.
func (f *outcomeFlusher) close() {
	if f == nil {
		return
	}
	close(f.stop)
	<-f.done
	if f.flush() == nil || f.keep == "" {
		return
	}
	calls, dropped, err := sharedOutcomes.Keep(f.keep, time.Now())
	if dropped > 0 {
		f.logger.Warn("call outcomes kept at earlier stops dropped to keep the file small", zap.Int64("calls", dropped))
	}
	if err != nil {
		f.logger.Error("the call outcomes not added to the store could not be kept either; this stop loses them",
			zap.String("file", f.keep), zap.Error(err))
		return
	}
	if calls > 0 {
		f.logger.Warn("call outcomes not added to the store by this stop are kept and added at the next start",
			zap.String("file", f.keep), zap.Int64("calls", calls))
	}
}
