package platform

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/pgstore"
	"github.com/platformgw/gateway/internal/store/settlelog"
)

// PostgresStore keeps the platform's state in PostgreSQL, for a fleet: the
// same gateway on several machines against one database (docs/fleet.md).
//
//	store postgres {
//		dsn           {env.PLATFORM_PG_DSN}
//		node_id       gw-1
//		lease_ttl     30s
//		lease_max     100
//		settle        log|commit
//		log_dir       <path>
//		ship_interval 200ms
//	}
type PostgresStore struct {
	// DSN is the connection string; a {env.*} placeholder keeps the
	// password out of the config.
	DSN string `json:"dsn"`
	// NodeID names this gateway in lease rows; its host name when empty.
	NodeID string `json:"node_id,omitempty"`
	// LeaseTTL is how long a killed node's unused quota stays unavailable;
	// 30s.
	LeaseTTL caddy.Duration `json:"lease_ttl,omitempty"`
	// LeaseMax is the largest block of units a node leases at once; 100.
	LeaseMax *billing.Units `json:"lease_max,omitempty"`
	// Settle says when a call's settlement is acknowledged: "log" (the
	// default) once it is in the node's settlement log (durability sync
	// or write, as for the bbolt store), shipped to PostgreSQL in batches;
	// "commit" once PostgreSQL committed it (docs/fleet.md says what each
	// costs and what a node that never comes back loses).
	Settle string `json:"settle,omitempty"`
	// LogDir is the directory of the node's settlement log, one per node;
	// platform/pgstore-<node_id> under Caddy's data directory by default,
	// and a relative path is under that directory too. With settle
	// commit the log keeps only the settlements the node could not commit
	// by its stop, shipped at its next start.
	LogDir string `json:"log_dir,omitempty"`
	// ShipInterval is how long a settlement waits in the log before it is
	// shipped when fewer than a batch are waiting; 200ms.
	ShipInterval caddy.Duration `json:"ship_interval,omitempty"`

	dsn string // DSN with its placeholders replaced
}

// settleLog says whether settlements go through the node's log.
func (p *PostgresStore) settleLog() bool { return p.Settle == "" || p.Settle == "log" }

// logDir is the settlement log's directory, resolved.
func (p *PostgresStore) logDir() string {
	dir := p.LogDir
	if dir == "" {
		node := p.NodeID
		if node == "" {
			node, _ = os.Hostname()
		}
		dir = filepath.Join("platform", "pgstore-"+safeName(node))
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(caddy.AppDataDir(), dir)
	}
	return dir
}

// safeName keeps a node id usable as a file name.
func safeName(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '_'
		}
	}
	if len(b) == 0 {
		return "node"
	}
	return string(b)
}

// provision resolves the DSN's placeholders and checks the settings,
// without connecting (`caddy validate` provisions too).
func (p *PostgresStore) provision(repl *caddy.Replacer) error {
	dsn, err := repl.ReplaceOrErr(p.DSN, true, true)
	if err != nil {
		return fmt.Errorf("store postgres: dsn: %w", err)
	}
	if dsn == "" {
		return fmt.Errorf("store postgres: dsn is empty (set PLATFORM_PG_DSN, or write the dsn); see docs/configuration.md")
	}
	p.dsn = dsn
	if p.LeaseTTL < 0 || time.Duration(p.LeaseTTL) > 0 && time.Duration(p.LeaseTTL) < time.Second {
		return fmt.Errorf("store postgres: lease_ttl %s: at least 1s", time.Duration(p.LeaseTTL))
	}
	if p.LeaseMax != nil && *p.LeaseMax <= 0 {
		return fmt.Errorf("store postgres: lease_max must be positive")
	}
	if p.Settle != "" && p.Settle != "log" && p.Settle != "commit" {
		return fmt.Errorf("store postgres: settle %q: log or commit", p.Settle)
	}
	if p.ShipInterval < 0 {
		return fmt.Errorf("store postgres: ship_interval must be positive")
	}
	return nil
}

// identity names the database and node this config serves, without
// credentials: the pool key of the store, and what the logs and the admin
// API show.
func (p *PostgresStore) identity() string {
	where := "postgres"
	if u, err := url.Parse(p.dsn); err == nil && u.Scheme != "" {
		u.User = nil
		u.RawQuery = ""
		where = u.String()
	}
	return where + " (node " + p.NodeID + ")"
}

func (p *PostgresStore) open(logger *zap.Logger, durability settlelog.Mode, flush time.Duration, eager bool) (store.Store, error) {
	o := pgstore.Options{DSN: p.dsn, NodeID: p.NodeID, LeaseTTL: time.Duration(p.LeaseTTL), Logger: logger}
	if p.LeaseMax != nil {
		o.LeaseMax = *p.LeaseMax
	}
	if p.settleLog() {
		o.LogDir, o.Durability, o.FlushInterval, o.ShipInterval = p.logDir(), durability, flush, time.Duration(p.ShipInterval)
		o.EagerSync = eager
	} else {
		// settle commit: the log only keeps what the node could not
		// commit by its stop, fdatasync'd, for its next start.
		o.LogDir, o.SettleCommit, o.Durability = p.logDir(), true, settlelog.Sync
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := pgstore.Open(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("platform store %s: %w", p.identity(), err)
	}
	return s, nil
}

// parseStore reads `store <path>` (the bbolt file) or `store postgres {
// … }`.
func parseStore(d *caddyfile.Dispenser) (string, *PostgresStore, error) {
	args := d.RemainingArgs()
	switch {
	case len(args) == 1 && args[0] == "postgres":
		p, err := parseStorePostgres(d)
		return "", p, err
	case len(args) == 0:
		return "", nil, d.Err("store: missing argument (want 1: the store file, or postgres { dsn … })")
	case len(args) > 1:
		return "", nil, d.Errf("store: too many arguments (want 1), unexpected '%s'", args[1])
	}
	if d.NextBlock(d.Nesting()) {
		return "", nil, d.Errf("store takes no block, found '%s' in one (only store postgres { … } has one)", d.Val())
	}
	return args[0], nil, nil
}

// parseStorePostgres reads the block of `store postgres { … }`.
func parseStorePostgres(d *caddyfile.Dispenser) (*PostgresStore, error) {
	p := new(PostgresStore)
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if seen[name] {
			return nil, d.Errf("store postgres: %s set twice", name)
		}
		seen[name] = true
		arg, err := oneArg(d)
		if err != nil {
			return nil, err
		}
		switch name {
		case "dsn":
			p.DSN = arg
		case "node_id":
			p.NodeID = arg
		case "lease_ttl":
			dur, err := caddy.ParseDuration(arg)
			if err != nil || dur < time.Second {
				return nil, d.Errf("store postgres: lease_ttl '%s': a duration of at least 1s", arg)
			}
			p.LeaseTTL = caddy.Duration(dur)
		case "lease_max":
			u, err := billing.ParseUnits(arg)
			if err != nil || u <= 0 {
				return nil, d.Errf("store postgres: lease_max '%s': a positive number of units", arg)
			}
			p.LeaseMax = &u
		case "settle":
			if arg != "log" && arg != "commit" {
				return nil, d.Errf("store postgres: settle '%s': log (acknowledged once in the node's settlement log) or commit (once PostgreSQL committed it)", arg)
			}
			p.Settle = arg
		case "log_dir":
			p.LogDir = arg
		case "ship_interval":
			dur, err := caddy.ParseDuration(arg)
			if err != nil || dur <= 0 {
				return nil, d.Errf("store postgres: ship_interval '%s': a positive duration", arg)
			}
			p.ShipInterval = caddy.Duration(dur)
		default:
			return nil, d.Errf("store postgres: unknown setting '%s' (dsn, node_id, lease_ttl, lease_max, settle, log_dir, ship_interval)", name)
		}
	}
	if p.DSN == "" {
		return nil, d.Err("store postgres: dsn is required (dsn {env.PLATFORM_PG_DSN})")
	}
	return p, nil
}

// heldStore is the store this config serves once open.
type heldStore struct{ store.Store }

// The optional interfaces of a store: what only the bbolt file offers.
type (
	// storeHealth says why a store is unusable (a damaged file).
	storeHealth interface{ Err() error }
	// commitObserved feeds the store's commits and write failures to the
	// metrics and its failures to the log.
	commitObserved interface {
		ObserveCommits(func(d time.Duration, writes int))
		ObserveWriteFailures(func(writes int))
		SetLogger(*zap.Logger)
	}
	// storeBackup streams a consistent copy of the store file.
	storeBackup interface {
		Backup(w io.Writer, size func(int64)) (int64, error)
		Path() string
	}
)
