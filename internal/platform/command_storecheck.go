package platform

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/platformgw/gateway/internal/store/pgstore"
)

// cmdStoreCheckPostgres is `caddy platform store check --dsn`: a fleet's
// counters proved against its ledger, rollups and lease rows
// (pgstore.Check), each figure that differs named.
func cmdStoreCheckPostgres(c cli, dsn string) error {
	where := dsnWhere(dsn)
	rep, err := pgstore.Check(context.Background(), dsn)
	if err != nil {
		return fmt.Errorf("store %s: %w", where, err)
	}
	unchecked := make([]map[string]any, 0, len(rep.Unchecked))
	for _, u := range rep.Unchecked {
		unchecked = append(unchecked, map[string]any{"userId": u.UserID, "serviceId": u.ServiceID, "since": u.Since})
	}
	if c.fl.Bool("json") {
		return json.NewEncoder(c.out).Encode(map[string]any{"database": where, "ok": true, "schema": rep.Schema,
			"ledgerFrom": optTime(rep.LedgerFrom), "rollupsFrom": optTime(rep.RollupsFrom), "rollupsChecked": rep.Rollups,
			"accounts": rep.Accounts, "unchecked": unchecked, "allowances": rep.Allowances, "subscriptions": rep.Subscriptions,
			"leases": rep.Leases, "jobHolds": rep.JobHolds})
	}
	tw := tabwriter.NewWriter(c.out, 0, 0, 1, ' ', 0)
	fmt.Fprintf(tw, "Database:\t%s (schema %d)\n", where, rep.Schema)
	if rep.LedgerFrom.IsZero() {
		fmt.Fprintf(tw, "Ledger:\tno partition\n")
	} else if rep.LedgerPrunedBeforeMove {
		fmt.Fprintf(tw, "Ledger:\trows from %s on (earlier rows were pruned in the bbolt store moved here by store migrate)\n",
			rep.LedgerFrom.Format(time.RFC3339))
	} else {
		fmt.Fprintf(tw, "Ledger:\trows from %s on (its first partition; earlier ones were dropped by retention or never made)\n",
			rep.LedgerFrom.Format(time.RFC3339))
	}
	if rep.RollupsFrom.IsZero() {
		fmt.Fprintf(tw, "Rollups:\tnone\n")
	} else {
		fmt.Fprintf(tw, "Rollups:\tfrom %s on; the %d rollups of the hours the ledger still holds equal its rows\n",
			rep.RollupsFrom.Format(time.RFC3339), rep.Rollups)
	}
	fmt.Fprintf(tw, "Counters:\tused and spend of %d subscriptions equal their ledger rows (and the rollups of dropped partitions)\n", rep.Accounts)
	if n := len(rep.Unchecked); n > 0 {
		var names []string
		for _, u := range rep.Unchecked[:min(n, 5)] {
			names = append(names, fmt.Sprintf("user %q service %q since %s", u.UserID, u.ServiceID, u.Since.Format(time.RFC3339)))
		}
		if n > 5 {
			names = append(names, fmt.Sprintf("%d more", n-5))
		}
		fmt.Fprintf(tw, "Unchecked:\tused and spend of %d subscriptions whose usage reaches back before the rows and rollups held (pruned): %s\n",
			n, strings.Join(names, "; "))
	}
	fmt.Fprintf(tw, "Leases:\tleased_units and leased_spend of %d allowances, credits_held of %d subscriptions equal their %d node leases and %d job holds; every job hold is of an open job\n",
		rep.Allowances, rep.Subscriptions, rep.Leases, rep.JobHolds)
	fmt.Fprintf(tw, "Balances:\tnot checked: a credit grant writes no ledger row, so a balance cannot be derived\n")
	fmt.Fprintf(tw, "In flight:\tsettlements not yet shipped from the nodes' settlement logs are in neither the ledger nor the counters (their units are leased)\n")
	fmt.Fprintln(tw, "Result:\tOK (schema, rollups, counters, leases, job holds; one snapshot)")
	return tw.Flush()
}

// dsnWhere names the database of dsn without its credentials, as the
// running gateway names its store (PostgresStore.identity).
func dsnWhere(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		u.User = nil
		u.RawQuery = ""
		return u.String()
	}
	return "postgres" // key=value pairs: the password may be among them
}

// optTime is t for JSON, or nil when zero.
func optTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}
