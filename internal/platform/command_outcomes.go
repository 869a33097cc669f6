package platform

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/platformgw/gateway/internal/ops"
)

// outcomesCommand is `caddy platform outcomes`: the hourly call outcomes
// summed by one dimension, and `outcomes export`, the stored rows.
func outcomesCommand() *cobra.Command {
	outcomes := &cobra.Command{
		Use:   "outcomes [--by outcome|user|service|endpoint|product] [--hourly] [filters]",
		Short: "Shows how calls ended: by outcome, user, service, endpoint or product, with latencies",
		Long: `
Prints the invoke calls that match the filters, charged or not, summed by
--by (outcome by default): how many, the median and 99th percentile of the
time the gateway added and of the backend's (the upper bound of the
histogram bucket they fall in). An outcome is 2xx (or 1xx, 3xx, 4xx) for an
answer the backend gave, 5xx for the backend's server errors, cut_off for an
answer cut short, and the error code of a call the gateway refused
(rate_limited, quota_exceeded, service_error, ...). --hourly prints a line
per hour. Every node's counts are in, but for each other node's last few
seconds.

	caddy platform outcomes --from 2026-11-26
	caddy platform outcomes --service weather --by endpoint --hourly
	caddy platform outcomes export --format csv > outcomes.csv`,
		Args: cobra.NoArgs,
		RunE: runCommand(cmdOutcomes),
	}
	outcomeFilterFlags(outcomes)
	outcomes.Flags().String("by", "outcome", "Sum by outcome, user, service, endpoint or product")
	outcomes.Flags().Bool("hourly", false, "A line per hour and group")

	export := &cobra.Command{
		Use:   "export [--format csv|json|ndjson] [filters]",
		Short: "Exports the hourly call outcome rows with their latency histograms",
		Long: `
Writes the stored hourly rows (hour, user, service, endpoint, product,
outcome, calls and the two latency histograms), every node's summed, to
standard output: CSV by default, or JSON (an array) or NDJSON.`,
		Args: cobra.NoArgs,
		RunE: runCommand(cmdOutcomesExport),
	}
	outcomeFilterFlags(export)
	export.Flags().String("format", formatCSV, "csv, json or ndjson")
	export.Flags().Bool("gzip", false, "Compress the transfer (for an admin endpoint on another machine)")
	outcomes.AddCommand(export)
	return outcomes
}

func outcomeFilterFlags(cmd *cobra.Command) {
	cmd.Flags().String("user", "", "Only the calls of this user")
	cmd.Flags().String("service", "", "Only the calls of this service")
	cmd.Flags().String("outcome", "", "Only the calls of this outcome")
	cmd.Flags().String("from", "", "From this hour on (RFC 3339 or YYYY-MM-DD)")
	cmd.Flags().String("to", "", "Before this time (RFC 3339), or up to and including this day (YYYY-MM-DD)")
}

// outcomeQuery is the admin API's query of the filter flags.
func (c cli) outcomeQuery() url.Values {
	q := url.Values{}
	for flag, param := range map[string]string{"user": "userId", "service": "serviceId", "outcome": "outcome", "from": "from", "to": "to"} {
		if v := c.fl.String(flag); v != "" {
			q.Set(param, v)
		}
	}
	return q
}

func cmdOutcomes(c cli, _ []string) error {
	q := c.outcomeQuery()
	q.Set("by", c.fl.String("by"))
	q.Set("hourly", strconv.FormatBool(c.fl.Bool("hourly")))
	var series ops.OutcomeSeries
	if printed, err := c.call(http.MethodGet, "/platform/outcomes/summary?"+q.Encode(), nil, &series); printed || err != nil {
		return err
	}
	return printOutcomes(c.out, series)
}

func printOutcomes(w io.Writer, s ops.OutcomeSeries) error {
	if len(s.Points) == 0 {
		_, err := fmt.Fprintln(w, "No calls.")
		return err
	}
	var total int64
	for _, p := range s.Points {
		total += p.Calls
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	if s.Hourly {
		fmt.Fprint(tw, "HOUR\t")
	}
	fmt.Fprintf(tw, "%s\tCALLS\tSHARE\tGATEWAY P50\tP99\tBACKEND P50\tP99\t\n", groupTitle(s.By))
	for _, p := range s.Points {
		if p.Hour != nil {
			fmt.Fprintf(tw, "%s\t", p.Hour.UTC().Format("2006-01-02 15:04"))
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f%%\t%s\t%s\t%s\t%s\t\n", orDash(p.Group), p.Calls, 100*float64(p.Calls)/float64(total),
			micros(p.Gateway.P50Micros), micros(p.Gateway.P99Micros), micros(p.Backend.P50Micros), micros(p.Backend.P99Micros))
	}
	fmt.Fprintf(tw, "TOTAL\t")
	if s.Hourly {
		fmt.Fprint(tw, "\t")
	}
	fmt.Fprintf(tw, "%d\t\n", total)
	return tw.Flush()
}

func groupTitle(by string) string {
	if by == "" {
		return "ALL"
	}
	return map[string]string{"outcome": "OUTCOME", "user": "USER", "service": "SERVICE", "endpoint": "SERVICE/ENDPOINT",
		"product": "SERVICE/PRODUCT"}[by]
}

// micros prints a bucket bound: "≤250µs", "≤2.5ms"; "-" for none.
func micros(us int64) string {
	if us == 0 {
		return "-"
	}
	return "≤" + (time.Duration(us) * time.Microsecond).String()
}

func cmdOutcomesExport(c cli, _ []string) error {
	q := c.outcomeQuery()
	q.Set("format", c.fl.String("format"))
	if c.fl.Bool("json") && !c.fl.Changed("format") {
		q.Set("format", formatJSON)
	}
	q.Set("gzip", strconv.FormatBool(c.fl.Bool("gzip")))
	resp, err := c.request(http.MethodGet, "/platform/outcomes?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(c.out, resp.Body); err != nil {
		return fmt.Errorf("outcome export interrupted: %v", err)
	}
	return nil
}
