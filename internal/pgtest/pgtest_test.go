package pgtest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestDB: the database is fresh, usable, and gone after the test.
func TestDB(t *testing.T) {
	var dsn string
	t.Run("use", func(t *testing.T) {
		dsn = DB(t)
		Query(t, dsn, "CREATE TABLE t (v int); INSERT INTO t VALUES (42)")
		if got := Query(t, dsn, "SELECT v FROM t"); got != "42" {
			t.Fatalf("SELECT = %q", got)
		}
	})
	if dsn == "" {
		t.Skip("no server")
	}
	name := dsn[strings.LastIndex(dsn, "/")+1:]
	name = strings.SplitN(name, "?", 2)[0]
	if got := Query(t, ServerDSN(), "SELECT count(*) FROM pg_database WHERE datname = '"+name+"'"); got != "0" {
		t.Errorf("database %s still there after its test", name)
	}
}

func TestWithDatabase(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable": "postgres://postgres@127.0.0.1:5432/x?sslmode=disable",
		"host=127.0.0.1 user=postgres dbname=postgres":                "host=127.0.0.1 user=postgres dbname=x",
		"host=127.0.0.1 user=postgres":                                "host=127.0.0.1 user=postgres dbname=x",
	} {
		if got, err := WithDatabase(in, "x"); err != nil || got != want {
			t.Errorf("WithDatabase(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// TestCluster: a private cluster keeps its data across a stop and start.
// PGTEST_CLUSTER_PORT moves it (25451 by default: the fleet tests' cluster
// is on 25441, pgstore's on 25431).
func TestCluster(t *testing.T) {
	c := Cluster(t, ClusterPort(25451))
	Query(t, c.DSN(), "CREATE TABLE t (v int); INSERT INTO t VALUES (7)")
	c.Stop()
	if _, err := Exec(t.Context(), c.DSN(), "SELECT 1"); err == nil {
		t.Fatal("the cluster answers while stopped")
	}
	c.Start()
	if got := Query(t, c.DSN(), "SELECT v FROM t"); got != "7" {
		t.Fatalf("after a restart: %q", got)
	}
	c.Restart()
	db := c.DB("other")
	Query(t, db, "SELECT 1")
}

// TestStandbyFailover: a synchronous standby has every committed row,
// refuses writes until promoted, and takes them once promoted after its
// primary was stopped the hard way. PGTEST_CLUSTER_PORT moves the primary
// (25452 by default), the standby is on the next port.
func TestStandbyFailover(t *testing.T) {
	primary := Cluster(t, ClusterPort(25452))
	standby := primary.Standby(primary.Port+1, "s1")
	primary.SyncStandby("s1")
	Query(t, primary.DSN(), "CREATE TABLE t (v int); INSERT INTO t VALUES (7)")
	if _, err := Exec(t.Context(), standby.DSN(), "INSERT INTO t VALUES (8)"); err == nil {
		t.Fatal("the standby took a write before its promotion")
	}
	primary.Kill()
	standby.Promote()
	Query(t, standby.DSN(), "INSERT INTO t VALUES (8)")
	if got := Query(t, standby.DSN(), "SELECT string_agg(v::text, ',' ORDER BY v) FROM t"); got != "7,8" {
		t.Fatalf("after the failover: %q, want 7,8", got)
	}
}

func TestClusterPort(t *testing.T) {
	for env, want := range map[string]int{"": 25431, "25499": 25499, "0": 25431, "x": 25431} {
		t.Setenv("PGTEST_CLUSTER_PORT", env)
		if got := ClusterPort(25431); got != want {
			t.Errorf("PGTEST_CLUSTER_PORT=%q: ClusterPort(25431) = %d, want %d", env, got, want)
		}
	}
}

// TestUnreachable: with CI=true a test whose server cannot be reached
// fails; without, it is skipped saying why.
func TestUnreachable(t *testing.T) {
	if os.Getenv("PGTEST_UNAVAILABLE_CHILD") == "1" {
		DB(t)
		t.Log("reached an unreachable server")
		return
	}
	// A port nothing listens on (TEST-NET addresses would wait for the
	// connect timeout).
	checkUnavailable(t, "TestUnreachable", "PLATFORM_TEST_PG_DSN=postgres://postgres@127.0.0.1:1/postgres?sslmode=disable")
}

// TestClusterToolsMissing: with CI=true a test that needs a private
// cluster and finds no initdb fails; without, it is skipped saying why.
func TestClusterToolsMissing(t *testing.T) {
	if os.Getenv("PGTEST_UNAVAILABLE_CHILD") == "1" {
		Cluster(t, ClusterPort(25451))
		t.Log("started a cluster without the PostgreSQL tools")
		return
	}
	checkUnavailable(t, "TestClusterToolsMissing", "PATH="+t.TempDir())
}

// checkUnavailable runs test in a child process with env, where it cannot
// have its PostgreSQL: it must fail with CI=true and skip without.
func checkUnavailable(t *testing.T, test string, env ...string) {
	t.Helper()
	for _, ci := range []string{"true", ""} {
		cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.v")
		cmd.Env = append(append(os.Environ(), "PGTEST_UNAVAILABLE_CHILD=1", "CI="+ci), env...)
		out, err := cmd.CombinedOutput()
		switch {
		case ci == "true" && (err == nil || !strings.Contains(string(out), "--- FAIL")):
			t.Errorf("CI=true: %v\n%s", err, out)
		case ci == "" && (err != nil || !strings.Contains(string(out), "--- SKIP")):
			t.Errorf("CI unset: %v\n%s", err, out)
		}
	}
}
