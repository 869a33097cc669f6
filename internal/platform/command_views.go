package platform

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/platformgw/gateway/internal/ops"
)

// addViewCommands adds the operator's views to `caddy platform`:
// subscription show|list, summary and jobs.
func addViewCommands(cmd *cobra.Command) {
	subscription := &cobra.Command{
		Use:   "subscription",
		Short: "Shows and lists subscriptions",
	}
	show := &cobra.Command{
		Use:   "show --user <id> --service <id>",
		Short: "Shows one subscription with its current billing period",
		Args:  cobra.NoArgs,
		RunE:  runCommand(cmdSubscriptionShow),
	}
	show.Flags().String("user", "", "User id (required)")
	show.Flags().String("service", "", "Service id (required)")
	list := &cobra.Command{
		Use:   "list [--user <id>] [--limit <n>]",
		Short: "Lists subscriptions, of one user or of all, page by page",
		Long: `
Lists subscriptions in (user, service) order: one user's with --user, every
user's without. The admin API answers in pages of --limit (default 100);
the command follows them to the end, printing each as it arrives, so a
store with millions of subscriptions is listed in bounded memory. With
--json it prints each page's JSON, one per line.`,
		Args: cobra.NoArgs,
		RunE: runCommand(cmdSubscriptionList),
	}
	list.Flags().String("user", "", "Only the subscriptions of this user")
	list.Flags().Int("limit", ops.DefaultPageLimit, "Page size asked of the admin API (1 to 1000)")
	subscription.AddCommand(show, list)

	summary := &cobra.Command{
		Use:   "summary --user <id> [--service <id>] [--at <time>]",
		Short: "Summarizes a user's billing period: units used, quota left, credits, spend against the cap",
		Long: `
Prints, for each subscription of the user (or the one to --service), the
billing period that contains --at (now by default; an RFC 3339 time or a
date): its start and end, the units used and held by calls in flight, the
quota and what is left of it, the prepaid credits, and the spend against
the spending cap.`,
		Args: cobra.NoArgs,
		RunE: runCommand(cmdSummary),
	}
	summary.Flags().String("user", "", "User id (required)")
	summary.Flags().String("service", "", "Only this service")
	summary.Flags().String("at", "", "A time in the period to show (RFC 3339 or YYYY-MM-DD; default now)")

	jobs := &cobra.Command{
		Use:   "jobs [--user <id>] [--service <id>] [--status PENDING|RUNNING|COMPLETED|FAILED] [--limit <n>]",
		Short: "Lists async jobs by user, service and state",
		Long: `
Lists the async jobs that match the filters, in job id order, following the
admin API's pages to the end (--limit is the page size). For example, the
jobs a backend never completed:

	caddy platform jobs --status PENDING`,
		Args: cobra.NoArgs,
		RunE: runCommand(cmdJobs),
	}
	jobs.Flags().String("user", "", "Only this user's jobs")
	jobs.Flags().String("service", "", "Only this service's jobs")
	jobs.Flags().String("status", "", "Only jobs in this state")
	jobs.Flags().Int("limit", ops.DefaultPageLimit, "Page size asked of the admin API (1 to 1000)")

	cmd.AddCommand(subscription, summary, jobs)
}

// cliPeriod is a periodSummary as the CLI reads it: quantities kept as the
// exact decimals they were sent as (credits may be negative, which
// billing.Units does not read).
type cliPeriod struct {
	ServiceID       string      `json:"serviceId"`
	ProductID       string      `json:"productId"`
	Status          string      `json:"status"`
	BillingModel    string      `json:"billingModel"`
	UnitLabel       string      `json:"unitLabel"`
	PeriodStart     time.Time   `json:"periodStart"`
	PeriodEnd       time.Time   `json:"periodEnd"`
	EndsAt          time.Time   `json:"endsAt"`
	ProductMissing  bool        `json:"productMissing"`
	UnitsUsed       json.Number `json:"unitsUsed"`
	UnitsHeld       json.Number `json:"unitsHeld"`
	Quota           json.Number `json:"quota"`
	UnitsRemaining  json.Number `json:"unitsRemaining"`
	OverageUnits    json.Number `json:"overageUnits"`
	Credits         json.Number `json:"credits"`
	CreditsHeld     json.Number `json:"creditsHeld"`
	Spend           json.Number `json:"spend"`
	SpendingCap     json.Number `json:"spendingCap"`
	SpendRemaining  json.Number `json:"spendingCapRemaining"`
	CostUnit        string      `json:"costUnit"`
	MeasurementType string      `json:"measurementType"`
	CallsCutAtLimit int64       `json:"callsCutAtLimit"`
}

// usedLine says what the period used, against the quota when there is one.
func (p cliPeriod) usedLine() string {
	unit := p.UnitLabel
	if unit == "" {
		unit = "unit"
	}
	s := fmt.Sprintf("%s %s used", p.UnitsUsed, unitsOf(p.UnitsUsed, unit))
	if p.Quota != "" {
		s += fmt.Sprintf(" of %s included, %s left", p.Quota, p.UnitsRemaining)
		if p.OverageUnits != "" && p.OverageUnits != "0" {
			s += fmt.Sprintf(", %s over", p.OverageUnits)
		}
	}
	if p.UnitsHeld != "" && p.UnitsHeld != "0" {
		s += fmt.Sprintf(" (%s held by calls in flight)", p.UnitsHeld)
	}
	return s
}

// unitsOf is the unit label for an amount: "6 requests", "1 request";
// a label that is not a plain lowercase word (ms, KB, tokens) as written.
func unitsOf(amount json.Number, label string) string {
	if amount == "1" || strings.HasSuffix(label, "s") || strings.TrimFunc(label, func(r rune) bool { return r >= 'a' && r <= 'z' }) != "" {
		return label
	}
	return label + "s"
}

// amount is a spend or cap figure with what it is counted in ("2 EUR",
// "3 credits"); bare when the product's listing names no currency.
func (p cliPeriod) amount(v json.Number) string {
	if p.CostUnit == "" {
		return string(v)
	}
	return string(v) + " " + p.CostUnit
}

func printPeriod(w io.Writer, p cliPeriod) error {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintf(tw, "Service:\t%s\n", p.ServiceID)
	fmt.Fprintf(tw, "Product:\t%s (%s)\n", p.ProductID, orDash(p.BillingModel))
	if p.EndsAt.IsZero() {
		fmt.Fprintf(tw, "Status:\t%s\n", p.Status)
	} else {
		// A trial's or a cancellation's end: calls are refused from it.
		fmt.Fprintf(tw, "Status:\t%s (end %s)\n", p.Status, timeOr(p.EndsAt, "-"))
	}
	if p.ProductMissing {
		fmt.Fprintf(tw, "Period:\tunknown: product %s is not in the running catalog (calls are refused)\n", p.ProductID)
		fmt.Fprintf(tw, "Credits:\t%s\n", p.Credits)
		return tw.Flush()
	}
	fmt.Fprintf(tw, "Period:\t%s to %s\n", timeOr(p.PeriodStart, "-"), timeOr(p.PeriodEnd, "-"))
	fmt.Fprintf(tw, "Usage:\t%s\n", p.usedLine())
	credits := string(p.Credits)
	if p.CreditsHeld != "" && p.CreditsHeld != "0" {
		credits += " (" + string(p.CreditsHeld) + " held)"
	}
	fmt.Fprintf(tw, "Credits:\t%s\n", credits)
	spend := p.amount(p.Spend)
	if p.SpendingCap != "" {
		spend += fmt.Sprintf(" of cap %s, %s left", p.amount(p.SpendingCap), p.amount(p.SpendRemaining))
	}
	fmt.Fprintf(tw, "Spend:\t%s\n", spend)
	if p.CallsCutAtLimit > 0 {
		fmt.Fprintf(tw, "Cut at a limit:\t%d calls stated more units than a hard limit let be charged (unitsUncharged in the usage export)\n", p.CallsCutAtLimit)
	}
	return tw.Flush()
}

func cmdSubscriptionShow(c cli, _ []string) error {
	path, err := subscriptionPath(c)
	if err != nil {
		return err
	}
	user := c.fl.String("user")
	var resp struct {
		Subscriptions []cliPeriod `json:"subscriptions"`
	}
	uri := "/platform/users/" + url.PathEscape(user) + "/summary?" + url.Values{"serviceId": {c.fl.String("service")}}.Encode()
	if c.fl.Bool("json") {
		// The stored subscription itself, as GET returns it.
		_, err := c.call(http.MethodGet, path, nil, nil)
		return err
	}
	if _, err := c.call(http.MethodGet, uri, nil, &resp); err != nil {
		return err
	}
	fmt.Fprintf(c.out, "User:    %s\n", user)
	for _, p := range resp.Subscriptions {
		if err := printPeriod(c.out, p); err != nil {
			return err
		}
	}
	return nil
}

// pages fetches uri page by page (limit, cursor), handing each raw page to
// fn, until the admin API gives no next cursor. With --json each page is
// printed as one line.
func (c cli) pages(uri string, q url.Values, fn func(raw []byte) (next string, err error)) error {
	limit, err := c.fl.GetInt("limit")
	if err != nil {
		return err
	}
	q.Set("limit", strconv.Itoa(limit))
	for {
		resp, err := c.request(http.MethodGet, uri+"?"+q.Encode(), nil)
		if err != nil {
			return err
		}
		raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		resp.Body.Close()
		if err != nil {
			return fmt.Errorf("reading the response: %v", err)
		}
		var page struct {
			NextCursor string `json:"nextCursor"`
		}
		if err := json.Unmarshal(raw, &page); err != nil {
			return fmt.Errorf("decoding the response: %v", err)
		}
		if c.fl.Bool("json") {
			if _, err := c.out.Write(raw); err != nil {
				return err
			}
		} else if _, err := fn(raw); err != nil {
			return err
		}
		if page.NextCursor == "" {
			return nil
		}
		q.Set("cursor", page.NextCursor)
	}
}

func cmdSubscriptionList(c cli, _ []string) error {
	q := url.Values{}
	if user := c.fl.String("user"); user != "" {
		q.Set("userId", user)
	}
	tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
	if !c.fl.Bool("json") {
		fmt.Fprintln(tw, "USER\tSERVICE\tPRODUCT\tSTATUS\tSTARTED\tCREDITS")
	}
	err := c.pages("/platform/subscriptions", q, func(raw []byte) (string, error) {
		var page struct {
			Subscriptions []subscriptionView `json:"subscriptions"`
		}
		if err := json.Unmarshal(raw, &page); err != nil {
			return "", fmt.Errorf("decoding the response: %v", err)
		}
		for _, s := range page.Subscriptions {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.UserID, s.ServiceID, s.ProductID, s.Status, timeOr(s.StartedAt, "-"), s.Credits)
		}
		return "", tw.Flush()
	})
	if err != nil {
		return err
	}
	return tw.Flush()
}

func cmdSummary(c cli, _ []string) error {
	user, err := c.required("user")
	if err != nil {
		return err
	}
	q := url.Values{}
	if s := c.fl.String("service"); s != "" {
		q.Set("serviceId", s)
	}
	if at := c.fl.String("at"); at != "" {
		q.Set("at", at)
	}
	uri := "/platform/users/" + url.PathEscape(user) + "/summary"
	if len(q) > 0 {
		uri += "?" + q.Encode()
	}
	var resp struct {
		At            time.Time   `json:"at"`
		Subscriptions []cliPeriod `json:"subscriptions"`
	}
	if printed, err := c.call(http.MethodGet, uri, nil, &resp); printed || err != nil {
		return err
	}
	fmt.Fprintf(c.out, "User %s, billing periods at %s\n", user, timeOr(resp.At, "-"))
	if len(resp.Subscriptions) == 0 {
		_, err := fmt.Fprintln(c.out, "No subscriptions.")
		return err
	}
	for _, p := range resp.Subscriptions {
		fmt.Fprintln(c.out)
		if err := printPeriod(c.out, p); err != nil {
			return err
		}
	}
	return nil
}

func cmdJobs(c cli, _ []string) error {
	q := listFilters(c)
	tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
	if !c.fl.Bool("json") {
		fmt.Fprintln(tw, "REQUEST ID\tUSER\tSERVICE\tENDPOINT\tSTATUS\tSTARTED\tUPDATED\tERROR")
	}
	err := c.pages("/platform/jobs", q, func(raw []byte) (string, error) {
		var page struct {
			Jobs []struct {
				ID           string    `json:"requestId"`
				UserID       string    `json:"userId"`
				ServiceID    string    `json:"serviceId"`
				EndpointID   string    `json:"endpointId"`
				Status       string    `json:"status"`
				CreatedAt    time.Time `json:"startTime"`
				UpdatedAt    time.Time `json:"updatedAt"`
				ErrorMessage string    `json:"errorMessage"`
			} `json:"jobs"`
		}
		if err := json.Unmarshal(raw, &page); err != nil {
			return "", fmt.Errorf("decoding the response: %v", err)
		}
		for _, j := range page.Jobs {
			msg := strings.ReplaceAll(j.ErrorMessage, "\t", " ")
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", j.ID, j.UserID, j.ServiceID, j.EndpointID, j.Status,
				timeOr(j.CreatedAt, "-"), timeOr(j.UpdatedAt, "-"), orDash(msg))
		}
		return "", tw.Flush()
	})
	if err != nil {
		return err
	}
	return tw.Flush()
}

// listFilters is the query of a listing's --user, --service and --status
// flags (jobs, alerts).
func listFilters(c cli) url.Values {
	q := url.Values{}
	for flag, param := range map[string]string{"user": "userId", "service": "serviceId", "status": "status"} {
		if v := c.fl.String(flag); v != "" {
			q.Set(param, v)
		}
	}
	return q
}
