package platform

import (
	"sync/atomic"
	"time"
)

// clock is an app's time: time.Now, unless a test that drives a running
// server moved it (SetClock). It is the runtime's clock (newRuntime), so
// the handlers, the operations and the app's own loops read one time.
type clock struct {
	fn atomic.Pointer[func() time.Time]
}

// Now is the app's clock, the one its runtime (engine.Runtime.Clock) and
// operations read.
func (a *App) Now() time.Time {
	if fn := a.clock.fn.Load(); fn != nil {
		return (*fn)()
	}
	return time.Now()
}

// SetClock moves this app's clock, and so its runtime's, for tests that
// drive a running server past a job's expiry or a session's end; nil puts
// time.Now back. Safe while requests are served: the clock is read
// atomically, and only this app's (a reload's new app has its own).
func (a *App) SetClock(fn func() time.Time) {
	if fn == nil {
		a.clock.fn.Store(nil)
		return
	}
	a.clock.fn.Store(&fn)
}
