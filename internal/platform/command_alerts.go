package platform

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/platformgw/gateway/internal/alerts"
	"github.com/platformgw/gateway/internal/ops"
)

// alertsCommand is `caddy platform alerts`: the usage alerts as recorded,
// newest first, through GET /platform/alerts.
func alertsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "alerts [--user <id>] [--service <id>] [--status PENDING|DELIVERED|FAILED] [--limit <n>]",
		Short: "Lists usage alerts and their webhook deliveries",
		Long: `
Lists the usage alerts that fired (a subscription reaching a threshold of
its product: a share of the quota or of the spending cap, credits below an
amount), newest first, with the state of their webhook delivery: attempts,
last error, when delivered. It follows the admin API's pages to the end
(--limit is the page size). For example, the alerts not delivered yet:

	caddy platform alerts --status PENDING`,
		Args: cobra.NoArgs,
		RunE: runCommand(cmdAlerts),
	}
	cmd.Flags().String("user", "", "Only this user's alerts")
	cmd.Flags().String("service", "", "Only this service's alerts")
	cmd.Flags().String("status", "", "Only alerts in this state")
	cmd.Flags().Int("limit", ops.DefaultPageLimit, "Page size asked of the admin API (1 to 1000)")
	return cmd
}

func cmdAlerts(c cli, _ []string) error {
	q := listFilters(c)
	tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
	if !c.fl.Bool("json") {
		fmt.Fprintln(tw, "ALERT\tUSER\tSERVICE\tPRODUCT\tTHRESHOLD\tVALUE\tFIRED\tSTATUS\tATTEMPTS\tDELIVERED\tLAST ERROR")
	}
	err := c.pages("/platform/alerts", q, func(raw []byte) (string, error) {
		var page struct {
			Alerts []struct {
				ID          string      `json:"alertId"`
				UserID      string      `json:"userId"`
				ServiceID   string      `json:"serviceId"`
				ProductID   string      `json:"productId"`
				Threshold   string      `json:"threshold"`
				Value       json.Number `json:"value"`
				Currency    string      `json:"currency"`
				Unit        string      `json:"unit"`
				Created     time.Time   `json:"createdAt"`
				Status      string      `json:"status"`
				Attempts    int         `json:"attempts"`
				DeliveredAt time.Time   `json:"deliveredAt"`
				LastError   string      `json:"lastError"`
			} `json:"alerts"`
		}
		if err := json.Unmarshal(raw, &page); err != nil {
			return "", fmt.Errorf("decoding the response: %v", err)
		}
		for _, al := range page.Alerts {
			msg := strings.ReplaceAll(al.LastError, "\t", " ")
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", al.ID, al.UserID, al.ServiceID, al.ProductID,
				al.Threshold, alertValue(al.Value, al.Currency, al.Unit, al.Threshold), timeOr(al.Created, "-"), al.Status, al.Attempts, timeOr(al.DeliveredAt, "-"), orDash(msg))
		}
		return "", tw.Flush()
	})
	if err != nil {
		return err
	}
	return tw.Flush()
}

// alertValue is an alert's value with what it counts: its currency
// ("45.5 EUR"), its unit ("7 credits", "800 request"), or, for the spend
// of a product whose listing names no currency, that it is money in a
// currency not named; bare for an alert recorded before alerts said.
func alertValue(v json.Number, currency, unit, threshold string) string {
	switch {
	case currency != "":
		return string(v) + " " + currency
	case unit != "":
		return string(v) + " " + unit
	case strings.HasPrefix(threshold, alerts.MetricSpendingCap+" "):
		return string(v) + " (currency not named)"
	}
	return string(v)
}
