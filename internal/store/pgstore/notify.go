package pgstore

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"go.uber.org/zap"
)

// listener keeps a dedicated connection LISTENing for cache invalidations
// (key revocations, subscription and credit changes made on any node) and
// drops what they name from the node's cache as they arrive. While the
// connection is down the cache trusts its entries only CacheTTL, and it
// reconnects by itself; on reconnecting it drops everything, since
// notifications sent meanwhile are lost.
type listener struct {
	s    *Store
	isUp atomic.Bool
	// alive is when the connection was last known to deliver (nanoseconds
	// after born, on the monotonic clock): the LISTEN, a notification
	// received, or the sending of a ping it answered. A connection gone
	// silent without closing still looks up; keyTTL trusts a cached key
	// past CacheTTL only while alive is that recent.
	alive atomic.Int64
	born  time.Time
	// listened: a connection listened before this one (only the
	// listener's goroutine uses it).
	listened bool
	// ready closes at the first LISTEN; late says Open stopped waiting
	// for it (awaitFirst), so the node may lease before it listens.
	ready  chan struct{}
	late   atomic.Bool
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

func newListener(s *Store) *listener {
	return &listener{s: s, done: make(chan struct{}), ready: make(chan struct{}), born: time.Now()}
}

// firstListenWait bounds how long Open waits for the first LISTEN.
const firstListenWait = 5 * time.Second

// awaitFirst waits, for at most d, until the first LISTEN is in place, so
// that a node serves (leases) only once it hears of changes. A node that
// leased before it listened never heard of a change sent in between
// (credits taken, a report past a limit) and its leases served calls
// from units that change took (TestLeaseBeforeFirstListenAsksAgain).
// Past d (PostgreSQL answered Open but not this connection) the node
// serves all the same, and its first LISTEN makes the leases ask again,
// as after a connection lost.
func (l *listener) awaitFirst(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-l.ready:
	case <-ctx.Done():
		l.late.Store(true)
	case <-t.C:
		l.late.Store(true)
	}
}

func (l *listener) up() bool { return l.isUp.Load() }

// heard notes that what the server sent up to at reached the node.
func (l *listener) heard(at time.Time) { l.alive.Store(int64(at.Sub(l.born))) }

// fresh says whether the connection is up and was heard from within d:
// a notification sent more than d ago has arrived.
func (l *listener) fresh(d time.Duration) bool {
	return l.up() && time.Since(l.born)-time.Duration(l.alive.Load()) < d
}

// listenPing is how long the listener waits for a notification before it
// pings the server: a connection gone silent (its packets dropped, a
// proxy restarted behind it) is noticed within it and the ping's answer,
// and until then the cache trusts keys only CacheTTL (fresh). Before, it
// waited 5 s and a revoked key was accepted 5–7 s on such a node
// (TestRevocationReachesNodeWithSilentListener).
func (l *listener) listenPing() time.Duration { return max(l.s.opts.CacheTTL/2, 10*time.Millisecond) }

func (l *listener) start() {
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	go l.run(ctx)
}

func (l *listener) close() {
	l.once.Do(func() {
		if l.cancel != nil {
			l.cancel()
			<-l.done
		}
	})
}

func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := l.listen(ctx)
		l.isUp.Store(false)
		if ctx.Err() != nil {
			return
		}
		l.s.log.Warn("notification connection lost; caches trust entries "+l.s.opts.CacheTTL.String()+" until it is back",
			zap.Error(err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func (l *listener) listen(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, l.s.cfg.ConnConfig.ConnectTimeout+time.Second)
	cfg := l.s.cfg.ConnConfig.Copy()
	// A wait that times out only sets a deadline: no cancel request (a new
	// connection to the server) every few seconds.
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	conn, err := pgx.ConnectConfig(cctx, cfg)
	cancel()
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	listenAt := time.Now()
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		return err
	}
	l.heard(listenAt)
	// Whatever changed while no one listened is unknown: the cache goes,
	// and after a connection lost the leases ask the database again, as
	// they do at the first LISTEN of a node that served before it (late).
	// The first LISTEN of a node that waited for it (awaitFirst) preceded
	// every lease: nothing to ask again (leases asking again at start
	// strand the units of their calls in flight until the rows expire).
	if l.listened || l.late.Load() {
		l.s.leaser.InvalidateAll()
	}
	l.s.cache.dropAll()
	l.isUp.Store(true)
	// Open returns at ready (awaitFirst): the node is up by then, not a
	// moment after (TestLeaseBeforeFirstListenAsksAgain read up() false
	// about one run in ten).
	if !l.listened {
		close(l.ready)
	}
	l.listened = true
	for {
		// A bounded wait, so that a connection gone silent (a server
		// restarted behind a proxy) is noticed by the ping below.
		wctx, cancel := context.WithTimeout(ctx, l.listenPing())
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if wctx.Err() != nil && !conn.IsClosed() {
				pingAt := time.Now()
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				err = conn.Ping(pctx)
				cancel()
				if err == nil {
					// Notifications the server had for the node before the
					// ping are delivered ahead of its answer (buffered by
					// the connection, applied at the next wait, at once).
					l.heard(pingAt)
					continue
				}
			}
			return err
		}
		l.apply(n.Payload)
		l.heard(time.Now())
	}
}

// apply drops what a notification names from the cache.
func (l *listener) apply(payload string) {
	switch {
	case strings.HasPrefix(payload, "k"):
		raw, err := hex.DecodeString(payload[1:])
		if err != nil || len(raw) != 32 {
			l.s.cache.dropAll()
			return
		}
		var h [32]byte
		copy(h[:], raw)
		l.s.cache.dropKey(h)
	case strings.HasPrefix(payload, "s"), strings.HasPrefix(payload, "c"):
		var us [2]string
		if json.Unmarshal([]byte(payload[1:]), &us) != nil {
			l.s.leaser.InvalidateAll()
			l.s.cache.dropAll()
			return
		}
		if payload[0] == 'c' {
			// Credits were taken: the leases first, so that once a read
			// sees the balance no call is admitted from credits leased
			// before it.
			l.s.leaser.Invalidate(us[0], us[1])
		}
		l.s.cache.dropSub(us[0], us[1])
	case strings.HasPrefix(payload, "g"):
		// Another node's job completion asks for the units this node's
		// lease does not use (askLeasesBack); nothing else changed.
		var g giveBackNote
		if json.Unmarshal([]byte(payload[1:]), &g) != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := l.s.leaser.GiveBack(ctx, AllowanceKey{g.U, g.S, g.P}); err != nil {
			l.s.log.Warn("give a lease back for another node's completion (it expires by itself)", zap.Error(l.s.fail(err)))
		}
	default:
		l.s.leaser.InvalidateAll()
		l.s.cache.dropAll()
	}
}
