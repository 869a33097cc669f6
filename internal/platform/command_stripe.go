package platform

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/platformgw/gateway/internal/payments"
)

// stripeSyncCommand is `caddy platform stripe sync`, through POST
// /platform/stripe/sync (the running gateway holds the payments block's
// keys).
func stripeSyncCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "sync",
		Short: "Creates Stripe Products and Prices for paid products that have none, and prints the price lines",
		Long: `
For every listed product with a period price and no Price in the payments
block, creates a Stripe Product and a recurring Price (the period price in
the currency's minor units, the listing's currency, the product's period as
the interval), each with an idempotency key, and prints the lines to paste
into the payments block, then reload:

	caddy platform stripe sync
	price weather pro price_1Pq…

The config is not changed by this command: it is yours.`,
		Args: cobra.NoArgs,
		RunE: runCommand(cmdStripeSync),
	}
}

// stripeResyncCommand is `caddy platform stripe resync`, through POST
// /platform/stripe/resync.
func stripeResyncCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "resync",
		Short: "Reads every known customer's subscriptions and recent invoices back from Stripe and applies them",
		Long: `
For a webhook that was missed (the endpoint down longer than Stripe retries,
an event not enabled): lists the subscriptions of every Stripe customer the
gateway made, and their invoices of the last 35 days, and applies them with
the webhook handlers' code. Running it again changes nothing more.`,
		Args: cobra.NoArgs,
		RunE: runCommand(cmdStripeResync),
	}
}

func cmdStripeSync(c cli, _ []string) error {
	var res payments.SyncResult
	if printed, err := c.call("POST", "/platform/stripe/sync", nil, &res); err != nil || printed {
		return err
	}
	if len(res.Created) == 0 && len(res.Skipped) == 0 {
		fmt.Fprintln(c.out, "# every paid product has a Stripe Price already; nothing was created")
		return nil
	}
	if len(res.Created) > 0 {
		fmt.Fprintln(c.out, "# paste into the payments stripe { … } block, then reload:")
	}
	for _, p := range res.Created {
		fmt.Fprintf(c.out, "%s\t# %s a %s, Stripe product %s\n", p.Line, p.Amount, p.Interval, p.StripeID)
	}
	for _, s := range res.Skipped {
		fmt.Fprintf(c.out, "# skipped %s\n", s)
	}
	return nil
}

func cmdStripeResync(c cli, _ []string) error {
	var res payments.ResyncResult
	if printed, err := c.call("POST", "/platform/stripe/resync", nil, &res); err != nil || printed {
		return err
	}
	fmt.Fprintf(c.out, "customers %d, subscriptions applied %d, invoices recorded %d\n", res.Customers, res.Subscriptions, res.Invoices)
	for _, s := range res.Skipped {
		fmt.Fprintf(c.out, "skipped: %s\n", s)
	}
	return nil
}
