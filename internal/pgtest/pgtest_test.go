package pgtest

import (
	"os"
	"os/exec"
	"strconv"
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
// PGTEST_CLUSTER_PORT moves it (55441 by default).
func TestCluster(t *testing.T) {
	port := 55441
	if p, err := strconv.Atoi(os.Getenv("PGTEST_CLUSTER_PORT")); err == nil {
		port = p
	}
	c := Cluster(t, port)
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

// TestUnreachable: with CI=true a test whose server cannot be reached
// fails; without, it is skipped saying why.
func TestUnreachable(t *testing.T) {
	if os.Getenv("PGTEST_UNREACHABLE_CHILD") == "1" {
		DB(t)
		t.Log("reached an unreachable server")
		return
	}
	for _, ci := range []string{"true", ""} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestUnreachable$", "-test.v")
		cmd.Env = append(os.Environ(), "PGTEST_UNREACHABLE_CHILD=1", "CI="+ci,
			// A port nothing listens on (TEST-NET addresses would wait for
			// the connect timeout).
			"PLATFORM_TEST_PG_DSN=postgres://postgres@127.0.0.1:1/postgres?sslmode=disable")
		out, err := cmd.CombinedOutput()
		switch {
		case ci == "true" && (err == nil || !strings.Contains(string(out), "--- FAIL")):
			t.Errorf("CI=true: %v\n%s", err, out)
		case ci == "" && (err != nil || !strings.Contains(string(out), "--- SKIP")):
			t.Errorf("CI unset: %v\n%s", err, out)
		}
	}
}
