package platform

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/platformgw/gateway/internal/payments"
)

// stripeCommand is `caddy platform stripe`, the Stripe integration's
// commands (docs/payments.md).
func stripeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "stripe",
		Short: "Works with the Stripe integration (payments stripe { … })",
	}
	cmd.AddCommand(stripeReconcileCommand())
	return cmd
}

// stripeReconcileCommand is `caddy platform stripe reconcile`, through GET
// /platform/stripe/reconcile.
func stripeReconcileCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "reconcile --period <YYYY-MM | from..to> [--json]",
		Short: "Compares the metered usage of a period with Stripe's meter event summaries",
		Long: `
Compares, per Stripe customer and meter, the cost of the period's metered
usage in the gateway's ledger with what the meter shipper sent and with
Stripe's meter event summaries, and says which differ and why. Amounts are
in the product's currency. The command exits with status 1 when any row
differs, so a cron job can alert on it.

--period is a month (2026-11) or from..to, each a date (the end day is
included: 2026-11-01..2026-11-15) or an RFC 3339 time on the hour (the end
is excluded), in UTC.

	caddy platform stripe reconcile --period 2026-11
	caddy platform stripe reconcile --period 2026-11-01..2026-11-15 --json`,
		Args: cobra.NoArgs,
		RunE: runCommand(cmdStripeReconcile),
	}
	cmd.Flags().String("period", "", "A month (YYYY-MM) or from..to (required)")
	return cmd
}

func cmdStripeReconcile(c cli, _ []string) error {
	period, err := c.required("period")
	if err != nil {
		return err
	}
	resp, err := c.request(http.MethodGet, "/platform/stripe/reconcile?"+url.Values{"period": {period}}.Encode(), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("reading the response: %v", err)
	}
	var rec payments.Reconciliation
	if err := json.Unmarshal(raw, &rec); err != nil {
		return fmt.Errorf("decoding the response: %v", err)
	}
	if c.fl.Bool("json") {
		if _, err := c.out.Write(raw); err != nil {
			return err
		}
	} else if err := printReconciliation(c.out, rec); err != nil {
		return err
	}
	if rec.Differ > 0 {
		return fmt.Errorf("%d of %d customer meters differ from Stripe", rec.Differ, len(rec.Rows))
	}
	return nil
}

func printReconciliation(w io.Writer, rec payments.Reconciliation) error {
	fmt.Fprintf(w, "Period %s .. %s (UTC)\n\n", rec.From.Format(time.RFC3339), rec.To.Format(time.RFC3339))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CUSTOMER\tUSER\tMETER\tCURRENCY\tLEDGER\tSENT\tSTRIPE\tSTATUS")
	for _, r := range rec.Rows {
		status := "ok"
		if r.Differs {
			status = "DIFFERS: " + r.Reason
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", orDash(r.Customer), r.UserID, r.EventName, orDash(r.Currency),
			r.Ledger, r.Sent, r.Stripe, status)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\n%d customer meter(s), %d differ\n", len(rec.Rows), rec.Differ)
	return err
}
