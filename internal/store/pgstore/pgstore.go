// Package pgstore is store.Store on PostgreSQL, for a fleet: the same
// gateway binary on several machines against one database, any node
// serving any request. bbolt (internal/store/boltstore) stays the embedded default.
//
// What lives where (docs/fleet.md has the whole story):
//   - PostgreSQL holds everything durable: keys (as SHA-256 hashes),
//     subscriptions and credits, per-period allowances, leases, the ledger
//     (partitioned by month), idempotency claims, jobs, alerts and the
//     audit log. The schema is migrated by the nodes themselves at start,
//     under an advisory lock.
//   - Each node holds leases on the allowances of hard-limited
//     subscriptions (lease.go) and admits calls from them in memory; a
//     settlement it can decide alone is acknowledged once in its own
//     settlement log and shipped in batches (shiplog.go), any other is
//     group-committed, one transaction per batch (settle.go); keys and
//     subscriptions are cached and dropped on LISTEN/NOTIFY (notify.go).
package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"golang.org/x/sync/singleflight"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/settlelog"
	"github.com/platformgw/gateway/internal/store/vfs"
)

// Options configure a node's store.
type Options struct {
	// DSN is the PostgreSQL connection string (a URL or key=value pairs).
	DSN string
	// NodeID names this node in lease rows (its host name when empty). A
	// random suffix per Open tells a node's restarts apart.
	NodeID string
	// LeaseTTL is how long a lease outlives its last renewal: how long a
	// killed node's unused units stay unavailable. 30s when zero.
	LeaseTTL time.Duration
	// LeaseMax is the largest block of units a node leases at once. 100
	// units when zero.
	LeaseMax billing.Units
	// CacheTTL is how long a cached key or subscription is trusted while
	// the notification connection is down. 1s when zero.
	CacheTTL time.Duration
	// MaxConns bounds the pool; 16 when zero.
	MaxConns int32
	// Logger, when set, is told about failures (never a key or secret).
	Logger *zap.Logger
	// LogDir, when set, is the directory of the node's settlement log
	// (shiplog.go): a settlement its lease covers is acknowledged once it
	// is in the log and shipped to PostgreSQL in batches (settle log),
	// and what the group commit has not written by Close is kept there.
	// Empty: every settlement is acknowledged once committed (group
	// commit), and what is not committed by Close is dropped. One node
	// per directory; it must survive the node's restarts. Whatever the
	// log holds at Open is shipped before Open returns.
	LogDir string
	// SettleCommit, with LogDir set, acknowledges every settlement once
	// committed (settle commit): the log in LogDir only keeps the
	// settlements the node could not commit by Close (PostgreSQL
	// unreachable), shipped at its next Open, each call once by its id.
	SettleCommit bool
	// Durability says when a record of the settlement log is acknowledged
	// (settlelog.Sync: once fdatasync'd; settlelog.Write: once written).
	Durability settlelog.Mode
	// FlushInterval is how often Write durability fdatasyncs (5ms).
	FlushInterval time.Duration
	// EagerSync starts each of Sync durability's fdatasyncs as soon as
	// the one before ended, instead of pacing them
	// (settlelog.Options.Eager).
	EagerSync bool
	// ShipInterval is how long a settlement waits in the log before it is
	// shipped when fewer than a batch (1,000) are waiting; 200ms.
	ShipInterval time.Duration

	// logFS is the file system of the settlement log (nil: the OS's); the
	// tests' disk whose fdatasync fails.
	logFS vfs.FS
}

// Store is a node's store.Store on PostgreSQL.
type Store struct {
	pool   *pgxpool.Pool
	cfg    *pgxpool.Config
	opts   Options
	node   string // NodeID/incarnation: the prefix of this node's lease rows
	log    *zap.Logger
	leaser *Leaser
	cache  *readCache
	settle *settler
	ship   *shipper // nil: no settlement log
	logAck bool     // settlements its lease covers are acknowledged from ship (settle log)

	partMu     sync.Mutex
	partitions map[time.Time]struct{}

	holdSeq atomic.Uint64
	holdsMu sync.Mutex
	holds   map[string]*openHold

	changes changeSet
	listen  *listener

	knownMu   sync.Mutex
	knownRows map[AllowanceKey]row
	holdSums  holdSums

	roundTrips atomic.Int64

	// refills are the lease refills running in the background
	// (Leaser.topUp): the tests that compare the database with the node
	// wait on it for those in flight to land.
	refills sync.WaitGroup

	// subFlight shares one read of a key or a subscription among the
	// callers that find its cache entry expired at once.
	subFlight singleflight.Group

	// expired are the expired leases the last renewal read, for the
	// sweep after it (expiredRead: read and not swept yet).
	expiredMu   sync.Mutex
	expired     []LeaseRef
	expiredRead bool

	// settling counts, per lease holder, the calls between their
	// Leaser.Settle and their settlement's queueing (busy).
	settling holderCount

	// born and lastDown (nanoseconds after born, on the monotonic clock)
	// say when the node's maintenance (renewals and sweeps, every second)
	// last found PostgreSQL unreachable, or when the node started: the
	// sweep waits for lease_ttl after it (sweepExpired).
	born     time.Time
	lastDown atomic.Int64

	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

var _ store.Store = (*Store)(nil)

// Open connects to the database, migrates its schema (one node at a time,
// under an advisory lock), makes the ledger partitions ahead and starts
// the node's background work: the settlement loop, lease renewal and
// expiry, and the notification listener.
func Open(ctx context.Context, o Options) (*Store, error) {
	if o.DSN == "" {
		return nil, errors.New("pgstore: no DSN (set dsn in the store postgres block)")
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = 30 * time.Second
	}
	if o.LeaseMax <= 0 {
		o.LeaseMax = billing.Whole(100)
	}
	if o.CacheTTL <= 0 {
		o.CacheTTL = time.Second
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 16
	}
	if o.NodeID == "" {
		o.NodeID, _ = os.Hostname()
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	cfg, err := pgxpool.ParseConfig(o.DSN)
	if err != nil {
		return nil, fmt.Errorf("pgstore: the DSN does not parse (%v); see docs/configuration.md", redact(err))
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 3 * time.Second
	}
	cfg.MaxConns = o.MaxConns
	var b [4]byte
	rand.Read(b[:])
	s := &Store{
		cfg:        cfg,
		opts:       o,
		node:       o.NodeID + "/" + hex.EncodeToString(b[:]),
		log:        o.Logger,
		cache:      newReadCache(),
		partitions: make(map[time.Time]struct{}),
		holds:      make(map[string]*openHold),
		knownRows:  make(map[AllowanceKey]row),
		holdSums:   holdSums{by: make(map[AllowanceKey]billing.State)},
		stop:       make(chan struct{}),
		born:       time.Now(),
		logAck:     o.LogDir != "" && !o.SettleCommit,
	}
	// Count round trips (countingConn).
	dial := cfg.ConnConfig.DialFunc
	if dial == nil {
		d := &net.Dialer{KeepAlive: 30 * time.Second}
		dial = d.DialContext
	}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, n: &s.roundTrips}, nil
	}
	s.pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %v", redact(err))
	}
	if err := s.migrate(ctx); err != nil {
		s.pool.Close()
		return nil, err
	}
	if err := unfinishedImport(ctx, s.pool); err != nil {
		s.pool.Close()
		return nil, err
	}
	if err := s.ensurePartitionsAhead(ctx, time.Now()); err != nil {
		s.pool.Close()
		return nil, fmt.Errorf("pgstore: make ledger partitions: %w", err)
	}
	s.leaser = NewLeaser(pgLeases{s}, s.node, LeaseConfig{TTL: o.LeaseTTL, Max: o.LeaseMax,
		RefuseFor: 100 * time.Millisecond, Spawn: func(f func()) { s.refills.Go(f) }, Busy: func(h string) bool { return s.ship.busy(h) || s.settle.busy(h) || s.settling.busy(h) }}, nil)
	s.settle = newSettler(s)
	s.listen = newListener(s)
	s.settle.start(settleWorkers)
	if o.LogDir != "" {
		sh, err := openShipper(ctx, s, o.LogDir, settlelog.Options{Mode: o.Durability, FlushInterval: o.FlushInterval, Eager: o.EagerSync, FS: o.logFS}, o.ShipInterval)
		if err != nil {
			s.settle.close()
			s.pool.Close()
			return nil, err
		}
		s.ship = sh
	}
	s.wg.Add(1)
	go s.maintain()
	s.listen.start()
	s.listen.awaitFirst(ctx, firstListenWait)
	return s, nil
}

func (s *Store) migrate(ctx context.Context) error {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("pgstore: connect: %v: %w", redact(err), store.ErrUnavailable)
	}
	defer c.Release()
	if err := migrate(ctx, c.Conn()); err != nil {
		return fmt.Errorf("pgstore: %w", err)
	}
	return nil
}

// Node is the holder prefix of this node's leases (node id/incarnation).
func (s *Store) Node() string { return s.node }

// RoundTrips counts this node's round trips to PostgreSQL (countingConn).
func (s *Store) RoundTrips() int64 { return s.roundTrips.Load() }

// Stopping tells the store the process has begun to exit (not a config
// reload: the store outlives those): the calls waiting for their
// settlements to be committed are answered at once, their settlements
// written by the group commit or by Close, or kept in the settlement log
// for the next start (settler.stop).
func (s *Store) Stopping() { s.settle.stop() }

// Close finishes the settlements queued (those PostgreSQL does not take
// are kept in the settlement log, when the node has one, for its next
// start), gives every lease back (units of calls still in flight
// included: their charges are then capped against the limits; not the
// leases of the settlements kept), stops the background work and closes
// the pool.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.settle.close()
		if s.ship != nil {
			s.ship.close()
		}
		close(s.stop)
		s.wg.Wait()
		s.listen.close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.leaser.ReturnAll(ctx); err != nil {
			s.closeErr = fmt.Errorf("pgstore: give leases back (they expire by themselves within %s): %w", s.opts.LeaseTTL, err)
		}
		s.pool.Close()
	})
	return s.closeErr
}

// abandon stops the node as if it were killed: no settlement flushed, no
// lease returned (tests of a node's death).
func (s *Store) abandon() {
	s.closeOnce.Do(func() {
		s.settle.abandon()
		if s.ship != nil {
			s.ship.abandon()
		}
		close(s.stop)
		s.wg.Wait()
		s.listen.close()
		s.pool.Close()
	})
}

// noteDown records that the maintenance found PostgreSQL unreachable
// (sweepReady).
func (s *Store) noteDown(err error) {
	if errors.Is(err, store.ErrUnavailable) {
		s.lastDown.Store(int64(time.Since(s.born)))
	}
}

// retryMax is the longest a settlement waiting for the database (in the
// settlement log, or in the group commit) waits between two attempts to
// write it: 2 s, and at most a tenth of lease_ttl. Its charge consumes
// from a lease row that an outage longer than lease_ttl lets expire, and
// other nodes sweep that row lease_ttl after they last found the database
// down (sweepReady), at worst less one maintenance tick (a fifth of
// lease_ttl) after it is back: the charge must be written before. A fixed
// 2 s was longer than that whole margin with a short lease_ttl: shipped
// after the sweep, a node's calls were served again by another
// (TestDatabaseDownPastShortLeaseTTL).
func (s *Store) retryMax() time.Duration {
	return max(min(2*time.Second, s.opts.LeaseTTL/10), 50*time.Millisecond)
}

// holderCount counts something per lease holder.
type holderCount struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *holderCount) add(holder string, d int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	if c.n[holder] += d; c.n[holder] <= 0 {
		delete(c.n, holder)
	}
}

func (c *holderCount) busy(holder string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[holder] > 0
}

// leaseIdle is how long a lease with nothing held stays with a node that
// has no calls for it before its units go back to the allowance.
const leaseIdle = 2 * time.Second

// maintain renews the node's leases every second (returning those idle for
// leaseIdle), gives back leases other nodes let expire, and makes ledger
// partitions ahead.
func (s *Store) maintain() {
	defer s.wg.Done()
	tick := time.NewTicker(min(time.Second, s.opts.LeaseTTL/5))
	defer tick.Stop()
	lastPart := time.Now()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), min(time.Second, s.opts.LeaseTTL/5))
		if _, err := s.leaser.Renew(ctx, leaseIdle); err != nil {
			s.noteDown(err)
			s.log.Warn("renew leases", zap.Error(err))
		}
		if _, err := s.sweepExpired(ctx); err != nil {
			s.noteDown(err)
			s.log.Warn("return expired leases", zap.Error(err))
		}
		if time.Since(lastPart) > time.Hour {
			if s.ensurePartitionsAhead(ctx, time.Now()) == nil {
				lastPart = time.Now()
			}
		}
		cancel()
	}
}

// countingConn counts the round trips on a database socket: a write that
// follows a read (or opens the connection) starts one. pgx writes a
// request (a statement, or a pipelined batch) in one write and then reads
// its answer; a COPY streams its rows in several writes before it reads,
// and is one round trip too.
type countingConn struct {
	net.Conn
	n       *atomic.Int64
	writing atomic.Bool // the last call was a write
}

func (c *countingConn) Write(b []byte) (int, error) {
	if !c.writing.Swap(true) {
		c.n.Add(1)
	}
	return c.Conn.Write(b)
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.writing.Store(false)
	}
	return n, err
}

// fail maps a database error to what the store promises: a connection
// that failed or a server that is down or starting is store.ErrUnavailable
// (the gateway answers 503 store_unavailable), anything else is returned
// as is.
func (s *Store) fail(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrExists) ||
		errors.Is(err, store.ErrReplayed) || errors.Is(err, store.ErrStale) || errors.Is(err, store.ErrJobHold) ||
		errors.Is(err, store.ErrNoAccount) || errors.Is(err, store.ErrBadCursor) {
		return err
	}
	if unavailable(err) {
		return fmt.Errorf("%w: postgresql: %v", store.ErrUnavailable, redact(err))
	}
	return err
}

func unavailable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code[:2] {
		case "08", "53", "57", "58": // connection, resources, operator intervention, system
			return true
		case "40": // a deadlock or serialization failure the retries did not get past
			return true
		}
		// lock_not_available: a lock waited for past the server's
		// lock_timeout (a long transaction holding a row). Transient, as a
		// dropped connection is: a settlement batch or a shipment that met
		// it is retried, never taken for a statement that rejects its
		// records (which the shipper releases from the log: acknowledged
		// charges lost, TestShipmentLockTimeoutKeepsSettlements).
		return pe.Code == "55P03"
	}
	var ne net.Error
	var ce *pgconn.ConnectError
	switch {
	case errors.As(err, &ne), errors.As(err, &ce), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, context.DeadlineExceeded), pgconn.Timeout(err):
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "conn closed") || strings.Contains(msg, "closed pool") || strings.Contains(msg, "connection reset")
}

// retryable says a transaction lost a deadlock or a serialization race and
// can simply run again.
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001")
}

// redact keeps a password out of an error that quotes the DSN.
func redact(err error) string {
	msg := err.Error()
	return msg
}

// tx runs fn in a transaction, again when it loses a deadlock.
func (s *Store) tx(ctx context.Context, fn func(pgx.Tx) error) error {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		err = pgx.BeginFunc(ctx, s.pool, fn)
		if !retryable(err) {
			break
		}
	}
	return s.fail(err)
}
