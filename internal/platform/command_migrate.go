package platform

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/boltstore"
	"github.com/platformgw/gateway/internal/store/pgstore"
)

// storeMigrateCommand is `caddy platform store migrate`: a bbolt store
// file copied whole into an empty PostgreSQL database (docs/fleet.md,
// "Migrating a bbolt store").
func storeMigrateCommand() *cobra.Command {
	migrate := &cobra.Command{
		Use:   "migrate --to postgres --dsn <dsn> <bbolt file>",
		Short: "Copies a store file into an empty PostgreSQL store",
		Long: `
Copies everything a bbolt store file holds into an empty PostgreSQL
database, for a gateway moving to a fleet: keys (as their hashes),
subscriptions with their credits, usage counters, the ledger, jobs (open
ones with the units they hold), idempotency claims, alerts and the audit
log. Stop the gateway first: the file must not be in use.

The target must hold nothing yet (the schema is created if missing); a
database that already holds keys, subscriptions or usage is refused. After
copying, counts and totals of both sides are compared (keys, subscriptions
and their balances, counters and their sums, ledger entries and their
units and costs, jobs and their holds, idempotency claims, alerts, audit
entries), and the command fails, naming what differs, if anything does.
Until then the database is marked as holding an unfinished migration: a
migration cut off or failed leaves it so, and no gateway starts on it
(drop and create the database, and migrate again).

	caddy platform store migrate --to postgres \
		--dsn 'postgres://platform@db.internal:5432/platform' \
		/var/lib/caddy/.local/share/caddy/platform/platform.db`,
		Args: cobra.ExactArgs(1),
		RunE: runCommand(cmdStoreMigrate),
	}
	migrate.Flags().String("to", "", "Engine of the target store: postgres")
	migrate.Flags().String("dsn", "", "PostgreSQL connection string of the target (a URL or key=value pairs)")
	migrate.Flags().Int("batch", 1000, "Records per transaction")
	return migrate
}

func cmdStoreMigrate(c cli, args []string) error {
	to, err := c.required("to")
	if err != nil {
		return err
	}
	if to != "postgres" {
		return fmt.Errorf("--to %s: the only target is postgres", to)
	}
	dsn, err := c.required("dsn")
	if err != nil {
		return err
	}
	path := args[0]
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("the store file: %v", err)
	}
	ctx := context.Background()
	src, err := boltstore.Open(path)
	if errors.Is(err, boltstore.ErrLocked) {
		return fmt.Errorf("%s is in use: stop the gateway that serves it first (%v)", path, err)
	}
	if err != nil {
		return fmt.Errorf("open %s: %v", path, err)
	}
	defer src.Close()
	dst, err := pgstore.Open(ctx, pgstore.Options{DSN: dsn, NodeID: "migrate"})
	if err != nil {
		return fmt.Errorf("open the target: %v", err)
	}
	defer dst.Close()
	imp, ok := any(dst).(store.Importer)
	if !ok {
		return errors.New("this build's PostgreSQL store cannot import a store (no store.Importer)")
	}
	totals, err := migrateStore(ctx, src, imp, path, c.fl.Int("batch"))
	if err != nil {
		return err
	}
	if c.fl.Bool("json") {
		return json.NewEncoder(c.out).Encode(map[string]any{"from": path, "to": "postgres", "totals": totals})
	}
	fmt.Fprintf(c.out, "Copied %s into PostgreSQL; both sides agree:\n", path)
	tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
	for _, r := range totalsRows(totals) {
		fmt.Fprintf(tw, "  %s\t%s\n", r[0], r[1])
	}
	return tw.Flush()
}

// migrateStore copies src into dst, which must be empty, and checks that
// both sides sum the same.
func migrateStore(ctx context.Context, src store.Exporter, dst store.Importer, from string, batch int) (store.Totals, error) {
	empty, err := dst.Empty(ctx)
	if err != nil {
		return store.Totals{}, fmt.Errorf("read the target: %v", err)
	}
	if !empty {
		return store.Totals{}, errors.New("the target database is not empty: migrate into a new database (CREATE DATABASE …) that no gateway has used")
	}
	// Until the copy is whole and checked, the database says so: a node
	// started on it, a second migration and store check refuse it.
	if err := dst.BeginImport(ctx, from); err != nil {
		return store.Totals{}, fmt.Errorf("note the migration in the target: %v", err)
	}
	sent, err := src.Export(ctx, dst, batch)
	if err != nil {
		return sent, fmt.Errorf("copy: %v (the target holds part of the store now: drop and create the database before trying again)", err)
	}
	got, err := dst.Totals(ctx)
	if err != nil {
		return sent, fmt.Errorf("read the target's totals: %v", err)
	}
	if got != sent {
		var diff []string
		want, have := totalsRows(sent), totalsRows(got)
		for i := range want {
			if want[i][1] != have[i][1] {
				diff = append(diff, fmt.Sprintf("%s: %s in the file, %s in the target", want[i][0], want[i][1], have[i][1]))
			}
		}
		return got, fmt.Errorf("the copy does not match the file: %s", strings.Join(diff, "; "))
	}
	if err := dst.FinishImport(ctx); err != nil {
		return got, fmt.Errorf("note the migration finished in the target: %v (run the migration again into a new database)", err)
	}
	return got, nil
}

// totalsRows names each figure of t, for messages and the summary.
func totalsRows(t store.Totals) [][2]string {
	return [][2]string{
		{"keys", fmt.Sprint(t.Keys)},
		{"subscriptions", fmt.Sprint(t.Subscriptions)},
		{"credits (sum of balances)", t.Credits.String()},
		{"usage counters", fmt.Sprint(t.Counters)},
		{"units used (sum)", t.Used.String()},
		// Spend and cost are summed over every product, credits and every
		// currency together: a checksum of the copy, not an amount of money.
		{"spend (checksum: credits and every currency summed)", t.Spend.String()},
		{"ledger entries", fmt.Sprint(t.Ledger)},
		{"ledger units", t.LedgerUnits.String()},
		{"ledger cost (checksum: credits and every currency summed)", t.LedgerCost.String()},
		{"hourly rollups: calls", fmt.Sprint(t.RollupCalls)},
		{"hourly rollups: units", t.RollupUnits.String()},
		{"jobs", fmt.Sprint(t.Jobs)},
		{"open jobs holding units", fmt.Sprint(t.JobHolds)},
		{"idempotency claims", fmt.Sprint(t.Idempotency)},
		{"alerts", fmt.Sprint(t.Alerts)},
		{"audit entries", fmt.Sprint(t.Audit)},
		{"payment records", fmt.Sprint(t.PaymentRecords)},
		{"credit grants", fmt.Sprint(t.CreditGrants)},
		{"credit reversals", fmt.Sprint(t.CreditReversals)},
		{"leases", fmt.Sprint(t.Leases)},
	}
}
