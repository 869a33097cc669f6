// Package pgtest gives tests a real PostgreSQL: a fresh database on the
// server named by PLATFORM_TEST_PG_DSN (DB), or a private cluster of their
// own that they may stop and start (Cluster). It talks to the server with
// the psql client, so it adds no Go dependency to the packages it tests.
//
// With CI=true a test that cannot reach its server, or lacks the
// PostgreSQL tools, fails; elsewhere it is skipped with a message saying
// what to install or set.
package pgtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// DefaultDSN is the server the tests use when PLATFORM_TEST_PG_DSN is not
// set: a local PostgreSQL with trust authentication for local TCP.
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// ServerDSN returns PLATFORM_TEST_PG_DSN, or DefaultDSN.
func ServerDSN() string {
	if dsn := os.Getenv("PLATFORM_TEST_PG_DSN"); dsn != "" {
		return dsn
	}
	return DefaultDSN
}

// unavailable fails the test under CI and skips it elsewhere: in CI a
// PostgreSQL test that silently skipped would pass without testing.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("PostgreSQL is required with CI=true: %s", msg)
	}
	t.Skipf("PostgreSQL not available, skipping: %s (set PLATFORM_TEST_PG_DSN, or run a server on 127.0.0.1:5432 with trust auth for local TCP; .ci/run does)", msg)
}

// Exec runs SQL through psql against dsn and returns what it printed
// (unaligned, tuples only), with psql's error when it fails.
func Exec(ctx context.Context, dsn, sql string) (string, error) {
	cmd := exec.CommandContext(ctx, "psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-c", sql)
	cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=5")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("psql: %v: %s", err, strings.TrimSpace(errb.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

// Query runs SQL against dsn and fails the test when it fails.
func Query(t testing.TB, dsn, sql string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := Exec(ctx, dsn, sql)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return out
}

// DB creates a fresh, empty database on the server of ServerDSN, drops it
// when the test ends, and returns its DSN.
func DB(t testing.TB) string {
	t.Helper()
	return createDB(t, ServerDSN())
}

var unsafeName = regexp.MustCompile(`[^a-z0-9_]+`)

func createDB(t testing.TB, server string) string {
	t.Helper()
	if _, err := exec.LookPath("psql"); err != nil {
		unavailable(t, "no psql on PATH (Debian: apt-get install postgresql-client)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := Exec(ctx, server, "SELECT 1"); err != nil {
		unavailable(t, "cannot reach %s: %v", redact(server), err)
	}
	var b [4]byte
	rand.Read(b[:])
	name := unsafeName.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(name) > 40 {
		name = name[len(name)-40:]
	}
	name = "pgtest_" + strings.Trim(name, "_") + "_" + hex.EncodeToString(b[:])
	if _, err := Exec(ctx, server, `CREATE DATABASE "`+name+`"`); err != nil {
		t.Fatalf("create the test database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// WITH (FORCE): a store the test left open must not keep it.
		if _, err := Exec(ctx, server, `DROP DATABASE IF EXISTS "`+name+`" WITH (FORCE)`); err != nil {
			t.Errorf("drop the test database %s: %v", name, err)
		}
	})
	dsn, err := WithDatabase(server, name)
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

// WithDatabase returns dsn naming database name instead of its own, for
// a URL (postgres://…/db) or key=value pairs.
func WithDatabase(dsn, name string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("PLATFORM_TEST_PG_DSN is not a valid URL: %v", err)
		}
		u.Path = "/" + name
		return u.String(), nil
	}
	var kept []string
	for _, f := range strings.Fields(dsn) {
		if !strings.HasPrefix(f, "dbname=") {
			kept = append(kept, f)
		}
	}
	return strings.Join(append(kept, "dbname="+name), " "), nil
}

// redact drops a password from a DSN for messages.
func redact(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
			return u.String()
		}
	}
	return dsn
}

// Instance is a private PostgreSQL server in a temp dir, on 127.0.0.1 and
// a port of the test's choosing, with trust authentication, for the tests
// that stop and start the database under load. It is stopped and removed
// when the test ends.
type Instance struct {
	Port int
	dir  string // owned by the cluster's user
	data string
	log  string
	user string // run the tools as this user ("" for ourselves)
	t    testing.TB
}

// ClusterPort is the port for a package's private cluster:
// PGTEST_CLUSTER_PORT when set, else def. Each package that starts one
// has its own default, so that two packages' tests running at once (go
// test runs packages in parallel) do not both claim one port.
func ClusterPort(def int) int {
	if p, err := strconv.Atoi(os.Getenv("PGTEST_CLUSTER_PORT")); err == nil && p > 0 {
		return p
	}
	return def
}

// Cluster initialises and starts a private cluster on port. As root it
// runs the PostgreSQL tools as the postgres user (initdb refuses root).
// It can be the primary of a Standby: initdb's defaults (wal_level
// replica, max_wal_senders 10, a replication line for 127.0.0.1 in
// pg_hba.conf with trust) are what streaming replication needs.
func Cluster(t testing.TB, port int) *Instance {
	t.Helper()
	c := newInstance(t, port, "initdb")
	if out, err := c.run("initdb", "-D", c.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync"); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	c.configure("postgresql.conf", fmt.Sprintf("listen_addresses = '127.0.0.1'\nport = %d\nunix_socket_directories = '%s'\nmax_connections = 200\n", port, c.dir))
	c.Start()
	return c
}

// Standby makes a streaming standby of c on port (pg_basebackup -R of the
// running c), named name in c's pg_stat_replication (its
// application_name, what synchronous_standby_names names), starts it and
// waits until c streams to it. It is stopped and removed when the test
// ends.
func (c *Instance) Standby(port int, name string) *Instance {
	c.t.Helper()
	s := newInstance(c.t, port, "pg_basebackup")
	if out, err := s.run("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(c.Port), "-U", "postgres",
		"-D", s.data, "-R", "-X", "stream", "--checkpoint=fast", "--no-sync"); err != nil {
		c.t.Fatalf("pg_basebackup: %v\n%s", err, out)
	}
	// postgresql.auto.conf: -R wrote primary_conninfo there, and it is
	// read after postgresql.conf (the primary's port and socket dir).
	s.configure("postgresql.auto.conf", fmt.Sprintf("port = %d\nunix_socket_directories = '%s'\nprimary_conninfo = 'host=127.0.0.1 port=%d user=postgres application_name=%s'\n",
		port, s.dir, c.Port, name))
	s.Start()
	c.waitFor("streaming to "+name, "SELECT count(*) FROM pg_stat_replication WHERE application_name = '"+name+"' AND state = 'streaming'", "1")
	return s
}

// SyncStandby makes c commit only once its standby name has the commit's
// WAL on disk (synchronous_standby_names, synchronous_commit on), and
// waits until c reports the standby as synchronous.
func (c *Instance) SyncStandby(name string) {
	c.t.Helper()
	Query(c.t, c.DSN(), "ALTER SYSTEM SET synchronous_standby_names = '"+name+"'")
	Query(c.t, c.DSN(), "SELECT pg_reload_conf()")
	c.waitFor(name+" synchronous", "SELECT count(*) FROM pg_stat_replication WHERE application_name = '"+name+"' AND sync_state = 'sync'", "1")
}

// Kill stops the cluster the hard way (pg_ctl stop -m immediate: the
// postmaster and its backends quit at once, as in a crash, with no
// shutdown checkpoint) and waits until it is down.
func (c *Instance) Kill() {
	c.t.Helper()
	if out, err := c.pgctl("stop", "-m", "immediate", "-w", "-t", "60"); err != nil {
		c.t.Fatalf("pg_ctl stop -m immediate: %v\n%s", err, out)
	}
}

// Promote promotes a standby (pg_ctl promote) and waits until it is out
// of recovery and takes writes.
func (c *Instance) Promote() {
	c.t.Helper()
	if out, err := c.pgctl("promote", "-w", "-t", "60"); err != nil {
		c.t.Fatalf("pg_ctl promote: %v\n%s\n%s", err, out, c.Log())
	}
	c.waitFor("out of recovery", "SELECT pg_is_in_recovery()", "f")
}

// waitFor polls sql on c until it prints want, for at most a minute.
func (c *Instance) waitFor(what, sql, want string) {
	c.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		got, err := Exec(ctx, c.DSN(), sql)
		cancel()
		if err == nil && got == want {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("cluster on port %d: not %s within a minute (%s: %q %v)\n%s", c.Port, what, sql, got, err, c.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// newInstance checks for the tools and the port and makes the instance's
// directory, removed (its server stopped) when the test ends; tool is the
// one that fills its data directory.
func newInstance(t testing.TB, port int, tool string) *Instance {
	t.Helper()
	for _, tool := range []string{tool, "pg_ctl", "psql"} {
		if _, err := exec.LookPath(tool); err != nil {
			unavailable(t, "no %s on PATH (Debian: apt-get install postgresql, and put /usr/lib/postgresql/*/bin on PATH)", tool)
		}
	}
	if c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 200*time.Millisecond); err == nil {
		c.Close()
		t.Fatalf("port %d is taken: a cluster of an earlier run still up? (pg_ctl stop -D <its dir>)", port)
	}
	// Not t.TempDir: its parents are 0700 and root's, out of reach of the
	// postgres user.
	dir, err := os.MkdirTemp("", "pgtest-cluster-")
	if err != nil {
		t.Fatal(err)
	}
	c := &Instance{Port: port, dir: dir, data: filepath.Join(dir, "data"), log: filepath.Join(dir, "postgres.log"), t: t}
	t.Cleanup(func() {
		c.pgctl("stop", "-m", "immediate", "-w", "-t", "30") // already stopped is fine
		os.RemoveAll(dir)
	})
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			unavailable(t, "running as root and there is no postgres user to run %s as", tool)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		c.user = "postgres"
	}
	return c
}

// configure appends settings to a configuration file of the data
// directory, as the cluster's user.
func (c *Instance) configure(file, settings string) {
	c.t.Helper()
	if out, err := c.run("sh", "-c", "cat >> "+filepath.Join(c.data, file)+" <<'EOF'\n\n"+settings+"EOF\n"); err != nil {
		c.t.Fatalf("configure the cluster: %v\n%s", err, out)
	}
}

// DSN is the cluster's postgres database.
func (c *Instance) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port)
}

// DB creates a fresh database in the cluster and returns its DSN (the
// cluster goes away with the test, and the database with it).
func (c *Instance) DB(name string) string {
	c.t.Helper()
	Query(c.t, c.DSN(), `CREATE DATABASE "`+name+`"`)
	dsn, _ := WithDatabase(c.DSN(), name)
	return dsn
}

// Start starts the cluster and waits until it accepts connections.
func (c *Instance) Start() {
	c.t.Helper()
	if out, err := c.pgctl("start", "-w", "-t", "60", "-l", c.log); err != nil {
		logs, _ := os.ReadFile(c.log)
		c.t.Fatalf("pg_ctl start: %v\n%s\n%s", err, out, logs)
	}
}

// Stop stops the cluster (fast: open connections are cut, as when a
// database server goes away) and waits until it is down.
func (c *Instance) Stop() {
	c.t.Helper()
	if out, err := c.pgctl("stop", "-m", "fast", "-w", "-t", "60"); err != nil {
		c.t.Fatalf("pg_ctl stop: %v\n%s", err, out)
	}
}

// Restart stops and starts the cluster.
func (c *Instance) Restart() {
	c.t.Helper()
	c.Stop()
	c.Start()
}

// Log returns the server's log so far, for failure messages.
func (c *Instance) Log() string {
	b, _ := os.ReadFile(c.log)
	return string(b)
}

func (c *Instance) pgctl(args ...string) ([]byte, error) {
	return c.run("pg_ctl", append([]string{"-D", c.data}, args...)...)
}

// run runs a tool as the cluster's user, bounded in time.
func (c *Instance) run(name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var cmd *exec.Cmd
	if c.user != "" {
		path, err := exec.LookPath(name)
		if err != nil {
			return nil, err
		}
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", c.user, "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, name, args...)
	}
	cmd.Dir = c.dir
	return cmd.CombinedOutput()
}
