package boltstore

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/disktest"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/settlelog"
)

// TestFullDiskRefusesHoldsAndRecovers: on a real file system that fills
// up, the first write whose commit fails marks the store unhealthy; from
// then on holds are refused at once with store.ErrUnavailable (a call is
// refused before it is forwarded, not served and then left unsettled), the
// failure count is exact, the log holds one line for the burst and one
// summary per interval; once the disk has room the next probe commits and
// holds are taken again. Nothing is charged that was not settled.
// It runs in both durability modes: in write mode the append's write(2)
// fails the same way.
func TestFullDiskRefusesHoldsAndRecovers(t *testing.T) {
	for _, mode := range []settlelog.Mode{settlelog.Sync, settlelog.Write} {
		t.Run(mode.String(), func(t *testing.T) { fullDiskRefusesHoldsAndRecovers(t, mode) })
	}
}

func fullDiskRefusesHoldsAndRecovers(t *testing.T, mode settlelog.Mode) {
	dir := disktest.Small(t, "2m")
	clock := t0
	defer func(p time.Duration, n func() time.Time) { probeInterval, healthNow = p, n }(probeInterval, healthNow)
	probeInterval, healthNow = time.Minute, func() time.Time { return clock }

	s, err := OpenWith(filepath.Join(dir, "platform.db"), Options{Durability: mode})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	core, logs := observer.New(zapcore.DebugLevel)
	s.SetLogger(zap.New(core))
	var observedN atomic.Int64
	s.ObserveWriteFailures(func(n int) { observedN.Add(int64(n)) })
	a := subscribe(t, s, "u1", "svc", unlimited, 0)
	filler := disktest.Fill(t, dir)

	settled, retried := 0, 0
	var firstErr error
	for i := 0; i < 100_000 && firstErr == nil; i++ {
		res, err := s.Reserve(ctx, a, whole(1), t0)
		dec := res.Decision
		if err != nil {
			firstErr = err
			break
		}
		if !dec.Allowed {
			t.Fatalf("refused %+v", dec)
		}
		if _, err := s.Settle(ctx, res, whole(1), entryFor(a, 0, t0)); err != nil {
			firstErr = err
			if errors.Is(err, store.ErrUnavailable) {
				// The call was served (a byte-measured body delivered, say):
				// the store charges it once it writes again.
				retried = 1
			}
			break
		}
		settled++
	}
	if firstErr == nil {
		t.Fatal("no write failed on a full disk")
	}
	t.Logf("the disk filled after %d calls: %v", settled, firstErr)
	if s.Healthy() {
		t.Fatalf("store healthy after a failed commit (%v)", firstErr)
	}
	failedBefore := s.WriteFailures()
	if failedBefore == 0 || uint64(observedN.Load()) != failedBefore {
		t.Fatalf("%d write failures counted, %d observed", failedBefore, observedN.Load())
	}

	// Holds are refused at once, without a commit.
	for range 100 {
		if _, err := s.Reserve(ctx, a, whole(1), t0); err != store.ErrUnavailable {
			t.Fatalf("Reserve on an unhealthy store: %v, want store.ErrUnavailable at once", err)
		}
	}
	if s.WriteFailures() != failedBefore {
		t.Errorf("refused holds counted as write failures")
	}

	// Other writes still try and are counted exactly when they fail; the
	// log sums them up once per interval, not once per write. (A small
	// settlement record may still fit in the last block the log's file
	// has: then it is written, durable and acknowledged.)
	const reports = 20
	failedReports, okReports := 0, 0
	for range reports {
		switch _, err := s.Record(ctx, a, entryFor(a, whole(1), t0), okResponse); {
		case err == nil:
			okReports++
		case errors.Is(err, store.ErrUnavailable):
			failedReports++
		default:
			t.Fatalf("Record on a full disk: %v, want an error wrapping store.ErrUnavailable", err)
		}
	}
	if failedReports == 0 {
		t.Fatal("no report failed on a full disk")
	}
	if got := s.WriteFailures() - failedBefore; got != uint64(failedReports) || uint64(observedN.Load()) != s.WriteFailures() {
		t.Errorf("%d more write failures counted (%d observed in all), want %d", got, observedN.Load(), failedReports)
	}
	if n := logs.FilterLevelExact(zapcore.ErrorLevel).Len(); n != 1 {
		t.Errorf("%d error lines for one burst inside the interval, want 1: %v", n, logs.All())
	}
	clock = clock.Add(logInterval + time.Second)
	for range 1000 { // until one fails
		if _, err := s.Record(ctx, a, entryFor(a, whole(1), t0), okResponse); err != nil {
			break
		}
		okReports++
	}
	errs := logs.FilterLevelExact(zapcore.ErrorLevel).All()
	if len(errs) != 2 || !strings.Contains(errs[1].Message, "store writes failed in the last") {
		t.Errorf("after the interval: %v, want one summary line", errs)
	}

	// A probe (one hold per interval) on the still-full disk finds no
	// room and is refused; the store stays unhealthy.
	clock = clock.Add(probeInterval)
	if _, err := s.Reserve(ctx, a, whole(1), t0); !errors.Is(err, store.ErrUnavailable) || s.Healthy() {
		t.Fatalf("probe on a full disk: %v, want it refused", err)
	}

	// Room again: the next probe commits, and holds are taken as before.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(probeInterval)
	for i := range 3 {
		res, err := s.Reserve(ctx, a, whole(1), t0)
		dec := res.Decision
		if err != nil || !dec.Allowed {
			t.Fatalf("call %d after the disk has room: %v %+v", i, err, dec)
		}
		if _, err := s.Settle(ctx, res, whole(1), entryFor(a, 0, t0)); err != nil {
			t.Fatalf("settle after the disk has room: %v", err)
		}
		settled++
	}
	if !s.Healthy() {
		t.Error("store still unhealthy after commits succeeded")
	}
	if warns := logs.FilterMessage("store writes succeed again").Len(); warns != 1 {
		t.Errorf("%d recovery lines, want 1", warns)
	}
	units, _ := sumUnits(ledger(t, s, store.LedgerFilter{}))
	if units != billing.Whole(int64(settled+retried+okReports)) {
		t.Errorf("ledger holds %s units for %d calls settled, %d whose settlement was retried and %d reports",
			units, settled, retried, okReports)
	}
	if st := stateOf(t, s, a, t0); st.Reserved != 0 {
		t.Errorf("holds left after recovery: %+v", st)
	}
}
