package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// baseDSN is the server the tests make their databases on.
func baseDSN() string {
	if dsn := os.Getenv("PLATFORM_TEST_PG_DSN"); dsn != "" {
		return dsn
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

// withDatabase returns dsn naming database db instead.
func withDatabase(t testing.TB, dsn, db string) string {
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme == "" {
		t.Fatalf("PLATFORM_TEST_PG_DSN must be a postgres:// URL: %v", err)
	}
	u.Path = "/" + db
	return u.String()
}

// newDatabase creates an empty database for the test and drops it after.
// Without a server the test skips, unless CI=true, where it fails.
func newDatabase(t testing.TB) string {
	t.Helper()
	return newDatabaseOn(t, baseDSN())
}

func newDatabaseOn(t testing.TB, base string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL at %s unreachable (CI=true: a PostgreSQL test never skips): %v", base, err)
		}
		t.Skipf("PostgreSQL unreachable (set PLATFORM_TEST_PG_DSN): %v", err)
	}
	defer conn.Close(ctx)
	var b [6]byte
	rand.Read(b[:])
	name := "pgstore_test_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Logf("drop database %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("drop database %s: %v", name, err)
		}
	})
	return withDatabase(t, base, name)
}

// openNode opens a store ("a node") on dsn, closed when the test ends.
func openNode(t testing.TB, dsn, node string, tune ...func(*Options)) *Store {
	t.Helper()
	o := Options{DSN: dsn, NodeID: node}
	for _, f := range tune {
		f(&o)
	}
	s, err := Open(context.Background(), o)
	if err != nil {
		t.Fatalf("open %s: %v", node, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func units(n int64) billing.Units { return billing.Whole(n) }

func ptr(u billing.Units) *billing.Units { return &u }

// subscribe stores an active subscription started now.
func subscribe(t testing.TB, s *Store, user, service, product string) {
	t.Helper()
	now := time.Now().UTC()
	if _, err := s.PutSubscription(context.Background(), store.Subscription{UserID: user, ServiceID: service, ProductID: product,
		Status: "ACTIVE", StartedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
}
