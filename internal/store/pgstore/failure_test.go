package pgstore

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store"
)

// privatePort is the port of the private cluster the failure tests stop
// and start (never the shared server's): PGTEST_CLUSTER_PORT, 55431 when
// unset.
func privatePort() int {
	if p, err := strconv.Atoi(os.Getenv("PGTEST_CLUSTER_PORT")); err == nil && p > 0 {
		return p
	}
	return 55431
}

// cluster is a private PostgreSQL cluster in a temporary directory.
type cluster struct {
	t    *testing.T
	dir  string
	port int
}

func (c *cluster) pgctl(args ...string) error {
	cmd := exec.Command("pg_ctl", append([]string{"-D", filepath.Join(c.dir, "data"), "-w", "-t", "30"}, args...)...)
	if os.Geteuid() == 0 {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", "pg_ctl", "-D", filepath.Join(c.dir, "data"), "-w", "-t", "30"}, args...)...)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl %v: %v\n%s", args, err, out)
	}
	return nil
}

func (c *cluster) start() {
	c.t.Helper()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", c.port, c.dir)
	if err := c.pgctl("-o", opts, "-l", filepath.Join(c.dir, "log"), "start"); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) stop(mode string) {
	c.t.Helper()
	if err := c.pgctl("-m", mode, "stop"); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) dsn() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// startCluster makes and starts a private cluster, stopped when the test
// ends. Without initdb the test skips, unless CI=true, where it fails.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	if _, err := exec.LookPath("initdb"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("initdb not found (CI=true: a PostgreSQL test never skips): %v", err)
		}
		t.Skipf("initdb not found: %v", err)
	}
	dir, err := os.MkdirTemp("", "pgstore-cluster-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c := &cluster{t: t, dir: dir, port: privatePort()}
	initdb := exec.Command("initdb", "-D", filepath.Join(dir, "data"), "-U", "postgres", "--auth=trust", "-E", "UTF8")
	if os.Geteuid() == 0 {
		pg, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root needs a postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(pg.Uid)
		gid, _ := strconv.Atoi(pg.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		initdb = exec.Command("runuser", "-u", "postgres", "--", "initdb", "-D", filepath.Join(dir, "data"), "-U", "postgres", "--auth=trust", "-E", "UTF8")
	}
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	c.start()
	t.Cleanup(func() { c.pgctl("-m", "immediate", "stop") })
	return c
}

// The database restarting: calls a lease covers go on, others get
// ErrUnavailable (never a panic, never an over-serve), and the node
// recovers by itself once the server is back.
func TestDatabaseRestart(t *testing.T) {
	c := startCluster(t)
	dsn := newDatabaseOn(t, c.dsn())
	s := openNode(t, dsn, "a", func(o *Options) { o.LeaseTTL = 10 * time.Second })
	ctx := context.Background()
	subscribe(t, s, "u", "svc", "q")
	subscribe(t, s, "u", "other", "q")
	acct := store.Account{UserID: "u", ServiceID: "svc", Product: quotaProduct(1000)}
	res, err := s.Reserve(ctx, acct, units(1), time.Now())
	dec := res.Decision
	if err != nil || !dec.Allowed {
		t.Fatal(dec, err)
	}
	if _, err := s.Settle(ctx, res, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc"}); err != nil {
		t.Fatal(err)
	}

	c.stop("fast")
	// The lease taken before covers further calls while it is valid...
	covered, err := s.Reserve(ctx, acct, units(1), time.Now())
	dec2 := covered.Decision
	if err != nil || !dec2.Allowed {
		t.Fatalf("a call the lease covers, database down: %+v %v", dec2, err)
	}
	// ...a subscription without a lease cannot be served.
	other := store.Account{UserID: "u", ServiceID: "other", Product: quotaProduct(1000)}
	if _, err := s.Reserve(ctx, other, units(1), time.Now()); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("no lease, database down: %v, want ErrUnavailable", err)
	}
	if _, err := s.KeyByHash(ctx, sha256.Sum256([]byte("k"))); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("key lookup, database down: %v", err)
	}
	if err := s.CreateKey(ctx, store.KeyRecord{ID: "k2", UserID: "u"}); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("write, database down: %v", err)
	}
	// The covered call's settlement waits for the database (bounded).
	done := make(chan error, 1)
	go func() {
		_, err := s.Settle(ctx, covered, units(1), store.LedgerEntry{UserID: "u", ServiceID: "svc"})
		done <- err
	}()
	time.Sleep(500 * time.Millisecond)
	c.start()
	if err := <-done; err != nil {
		t.Fatalf("settlement across the restart: %v", err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := s.Reserve(ctx, other, units(1), time.Now())
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not recovered after the restart: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	st, err := s.State(ctx, acct, time.Now())
	if err != nil || st.Used != units(2) {
		t.Fatalf("after recovery: used %s (%v), want 2", st.Used, err)
	}
}
