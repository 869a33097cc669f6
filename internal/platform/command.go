package platform

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/subscription"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "platform",
		Usage: "<key|subscribe|subscription|summary|credits|usage|outcomes|job|jobs> [flags]",
		Short: "Manages service keys, subscriptions, credits, usage and jobs of the platform gateway",
		Long: `
Manages the platform gateway of a running Caddy through its admin API:
service keys, subscriptions, prepaid credits, the usage ledger and async
jobs.

Like 'caddy reload', these commands talk to the admin endpoint at
'` + caddy.DefaultAdminListen + `' unless --address names another one, or
--config (with --adapter) points at the config whose admin address to use.

Add --json to print the admin API's JSON response instead of text.`,
		CobraFunc: buildPlatformCommand,
	})
}

// platformDocsFooter closes the help of `caddy platform` and its
// subcommands.
const platformDocsFooter = `Documented in the gateway's repository: docs/operations.md, sections "CLI"
and "Admin API" (README.md starts there). Caddy's own commands:
https://caddyserver.com/docs/command-line`

// buildPlatformCommand adds the subcommands of `caddy platform` to cmd.
func buildPlatformCommand(cmd *cobra.Command) {
	// Caddy's root help ends with Caddy's docs link, which every command
	// inherits; `caddy platform` is not in Caddy's docs, so its help (and
	// its subcommands') ends with where this one is documented instead.
	cmd.SetHelpTemplate(cmd.HelpTemplate() + "\n" + platformDocsFooter + "\n")
	pf := cmd.PersistentFlags()
	pf.String("address", "", "Address of the administration API listener (if --config is not used)")
	pf.StringP("config", "c", "", "Configuration file whose admin address to use (if --address is not used)")
	pf.StringP("adapter", "a", "", "Name of config adapter to apply (if --config is used)")
	pf.Bool("json", false, "Print the admin API's JSON response")

	key := &cobra.Command{
		Use:   "key",
		Short: "Creates, lists, shows and revokes service keys",
	}
	create := &cobra.Command{
		Use:   "create --user <id> [--roles a,b] [--label <text>] [--expires <time|duration>]",
		Short: "Creates a service key and prints it, once",
		Long: `
Creates a service key for a user and prints it. The key is shown only this
once: the gateway keeps only its hash. --expires takes an RFC 3339 time
(2027-01-01T00:00:00Z), a date (2027-01-01, midnight UTC) or a duration
from now (720h, 90d).

For scripts, --json prints {"keyId", "key", ...}:

	caddy platform key create --user alice --json | jq -r .key`,
		Args: cobra.NoArgs,
		RunE: runCommand(cmdKeyCreate),
	}
	create.Flags().String("user", "", "User id the key belongs to (required)")
	create.Flags().StringSlice("roles", nil, "Roles of the key, comma-separated")
	create.Flags().String("label", "", "A note to recognise the key by")
	create.Flags().String("expires", "", "Expiry: an RFC 3339 time, a date, or a duration from now such as 720h or 90d")
	list := &cobra.Command{
		Use:   "list [--user <id>]",
		Short: "Lists service keys (never the keys themselves)",
		Args:  cobra.NoArgs,
		RunE:  runCommand(cmdKeyList),
	}
	list.Flags().String("user", "", "Only the keys of this user")
	show := &cobra.Command{
		Use:   "show <keyId>",
		Short: "Shows one service key",
		Args:  cobra.ExactArgs(1),
		RunE:  runCommand(cmdKeyShow),
	}
	revoke := &cobra.Command{
		Use:   "revoke <keyId>",
		Short: "Revokes a service key at once (revoking again is harmless)",
		Args:  cobra.ExactArgs(1),
		RunE:  runCommand(cmdKeyRevoke),
	}
	key.AddCommand(create, list, show, revoke)

	subscribe := &cobra.Command{
		Use:   "subscribe --user <id> --service <id> --product <id> [--status ACTIVE]",
		Short: "Subscribes a user to a product of a service, or changes the subscription",
		Long: `
Creates or replaces the subscription of a user to a service. Changing the
product or status of an existing subscription keeps its start (the anchor of
its billing periods) and its credit balance. Statuses: ACTIVE (default),
TRIAL, CANCELLING and CANCELLING_PENDING grant access; EXPIRED, CANCELLED and
SUSPENDED do not.`,
		Args: cobra.NoArgs,
		RunE: runCommand(cmdSubscribe),
	}
	subscribe.Flags().String("user", "", "User id (required)")
	subscribe.Flags().String("service", "", "Service id (required)")
	subscribe.Flags().String("product", "", "Product id (required)")
	subscribe.Flags().String("status", string(subscription.Active), "Subscription status")

	credits := &cobra.Command{
		Use:   "credits",
		Short: "Manages the prepaid credits of a subscription",
	}
	add := &cobra.Command{
		Use:   "add --user <id> --service <id> --amount <decimal>",
		Short: "Adds prepaid credits to a subscription (a negative amount corrects)",
		Args:  cobra.NoArgs,
		RunE:  runCommand(cmdCreditsAdd),
	}
	add.Flags().String("user", "", "User id (required)")
	add.Flags().String("service", "", "Service id (required)")
	add.Flags().String("amount", "", "Credits to add, a decimal such as 10.5, or -2 to take some back (required)")
	credits.AddCommand(add)

	usage := &cobra.Command{
		Use:   "usage [--user <id>] [--service <id>] [--from <time>] [--to <time>] [--format csv|json|ndjson] [--rollup hour]",
		Short: "Exports the usage ledger in time order",
		Long: `
Writes the usage ledger to standard output in time order, streamed: CSV by
default, or JSON (an array) or NDJSON. --from and --to take RFC 3339 times or
dates; a date in --to includes that whole day (UTC). --rollup hour writes the
hourly sums per subscription, endpoint and product instead of the rows. A long
export reports its progress on standard error every 2 seconds.

	caddy platform usage --user alice --from 2026-01-01 --to 2026-01-31 > january.csv
	caddy platform usage prune --before 2026-01-01`,
		Args: cobra.NoArgs,
		RunE: runCommand(cmdUsage),
	}
	usage.Flags().String("user", "", "Only the usage of this user")
	usage.Flags().String("service", "", "Only the usage of this service")
	usage.Flags().String("from", "", "From this time on (RFC 3339 or YYYY-MM-DD)")
	usage.Flags().String("to", "", "Before this time (RFC 3339), or up to and including this day (YYYY-MM-DD)")
	usage.Flags().String("format", formatCSV, "csv, json or ndjson")
	usage.Flags().String("rollup", "", "hour: the hourly rollups instead of the rows")
	usage.Flags().Bool("gzip", false, "Compress the transfer (for an admin endpoint on another machine)")
	usage.AddCommand(usagePruneCommand()) // command_ledger.go

	job := &cobra.Command{
		Use:   "job <requestId>",
		Short: "Shows an async job as stored",
		Args:  cobra.ExactArgs(1),
		RunE:  runCommand(cmdJob),
	}

	cmd.AddCommand(key, subscribe, credits, usage, job)
	cmd.AddCommand(storeCommand()) // command_store.go
	addViewCommands(cmd)
	cmd.AddCommand(alertsCommand())   // command_alerts.go
	cmd.AddCommand(outcomesCommand()) // command_outcomes.go
	cmd.AddCommand(stripeCommand())   // command_stripe_reconcile.go
}

// cliFunc runs one `caddy platform` subcommand, writing its result to out.
type cliFunc func(c cli, args []string) error

// cli is what a subcommand works with: its flags, where to print, and the
// admin endpoint.
type cli struct {
	fl  caddycmd.Flags
	out io.Writer
}

// runCommand adapts a cliFunc to cobra. A failure is printed as one plain
// line on standard error, the way docs/operations.md shows it ("HTTP 400
// invalid_request: ..."), not as a JSON log line (caddycmd's wrapper logs
// it through Caddy's logger), and the command exits with status 1.
func runCommand(f cliFunc) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		err := f(cli{fl: caddycmd.Flags{FlagSet: cmd.Flags()}, out: cmd.OutOrStdout()}, args)
		if err != nil {
			fmt.Fprintf(cmd.ErrOrStderr(), "Error: %v\n", err)
			cmd.SilenceErrors = true
			cmd.SilenceUsage = true
		}
		return err
	}
}

// request sends a request to the admin API; the error of a refused request
// names the API's error code, message and field.
func (c cli) request(method, uri string, body any) (*http.Response, error) {
	addr, err := caddycmd.DetermineAdminAPIAddress(c.fl.String("address"), nil, c.fl.String("config"), c.fl.String("adapter"))
	if err != nil {
		return nil, fmt.Errorf("couldn't determine admin API address: %v", err)
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	resp, err := caddycmd.AdminAPIRequest(addr, method, uri, make(http.Header), rd)
	if err != nil {
		return nil, unreachableHint(addr, readableError(err))
	}
	return resp, nil
}

// readableError turns AdminAPIRequest's error for a refused request, which
// embeds the response body, into the API's code, message and field. Any
// other error is returned as it is.
func readableError(err error) error {
	var status int
	msg := err.Error()
	if _, scanErr := fmt.Sscanf(msg, "caddy responded with error: HTTP %d:", &status); scanErr != nil {
		return err
	}
	_, body, _ := strings.Cut(msg, ": HTTP ")
	_, body, _ = strings.Cut(body, ": ")
	var e apierror.Error
	if json.Unmarshal([]byte(body), &e) != nil || e.Code == "" {
		return err
	}
	text := fmt.Sprintf("HTTP %d %s: %s", status, e.Code, e.Message)
	if e.Field != "" {
		text += " (field " + e.Field + ")"
	}
	return errors.New(text)
}

// unreachableHint explains an admin endpoint that did not answer at all
// (AdminAPIRequest's "performing request: dial tcp ...: connection
// refused"), the first thing a new operator meets.
func unreachableHint(addr string, err error) error {
	if !strings.HasPrefix(err.Error(), "performing request:") {
		return err
	}
	return fmt.Errorf("cannot reach the admin endpoint %s: is the server running? "+
		"Start it with 'caddy run' (or 'caddy start'); if its admin endpoint is elsewhere, "+
		"pass --address or --config (%v)", addr, err)
}

// call sends a request and decodes the JSON response into v; with --json
// the response is printed as it came and v is left alone (printed false).
func (c cli) call(method, uri string, body, v any) (printed bool, err error) {
	resp, err := c.request(method, uri, body)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return false, fmt.Errorf("reading the response: %v", err)
	}
	if c.fl.Bool("json") {
		_, err = c.out.Write(raw)
		return true, err
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return false, fmt.Errorf("decoding the response: %v", err)
	}
	return false, nil
}

// required returns the value of a flag that must be given.
func (c cli) required(name string) (string, error) {
	v := c.fl.String(name)
	if v == "" {
		return "", fmt.Errorf("--%s is required", name)
	}
	return v, nil
}

func cmdKeyCreate(c cli, _ []string) error {
	user, err := c.required("user")
	if err != nil {
		return err
	}
	roles, err := c.fl.GetStringSlice("roles")
	if err != nil {
		return err
	}
	body := map[string]any{"userId": user}
	if len(roles) > 0 {
		body["roles"] = roles
	}
	if label := c.fl.String("label"); label != "" {
		body["label"] = label
	}
	if exp := c.fl.String("expires"); exp != "" {
		at, err := parseExpiry(exp, time.Now())
		if err != nil {
			return err
		}
		body["expiresAt"] = at.Format(time.RFC3339)
	}
	var k ops.KeyView
	if printed, err := c.call(http.MethodPost, "/platform/keys", body, &k); printed || err != nil {
		return err
	}
	tw := tabwriter.NewWriter(c.out, 0, 0, 1, ' ', 0)
	fmt.Fprintf(tw, "Key ID:\t%s\n", k.ID)
	fmt.Fprintf(tw, "User:\t%s\n", k.UserID)
	fmt.Fprintf(tw, "Roles:\t%s\n", orDash(strings.Join(k.Roles, ",")))
	fmt.Fprintf(tw, "Label:\t%s\n", orDash(k.Label))
	fmt.Fprintf(tw, "Expires:\t%s\n", timeOr(k.ExpiresAt, "never"))
	fmt.Fprintf(tw, "Key:\t%s\n", k.Key)
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintln(c.out, "\nThe key is shown only this once; only its hash is kept. Store it now.")
	return err
}

// parseExpiry reads an RFC 3339 time, a date (midnight UTC starting it),
// or a duration from now (Caddy's duration syntax, which adds days: 90d).
func parseExpiry(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	d, err := caddy.ParseDuration(s)
	if err != nil || d <= 0 {
		return time.Time{}, fmt.Errorf("--expires %q: want an RFC 3339 time such as 2027-01-01T00:00:00Z, a date, or a positive duration such as 720h or 90d", s)
	}
	return now.Add(d).UTC().Truncate(time.Second), nil
}

func cmdKeyList(c cli, _ []string) error {
	uri := "/platform/keys"
	if user := c.fl.String("user"); user != "" {
		uri += "?" + url.Values{"userId": {user}}.Encode()
	}
	var resp struct {
		Keys []ops.KeyView `json:"keys"`
	}
	if printed, err := c.call(http.MethodGet, uri, nil, &resp); printed || err != nil {
		return err
	}
	tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY ID\tUSER\tSTATUS\tROLES\tCREATED\tEXPIRES\tLABEL")
	for _, k := range resp.Keys {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.UserID, k.Status,
			orDash(strings.Join(k.Roles, ",")), timeOr(k.CreatedAt, "-"), timeOr(k.ExpiresAt, "never"), orDash(k.Label))
	}
	return tw.Flush()
}

func cmdKeyShow(c cli, args []string) error {
	var k ops.KeyView
	if printed, err := c.call(http.MethodGet, "/platform/keys/"+url.PathEscape(args[0]), nil, &k); printed || err != nil {
		return err
	}
	return printKey(c.out, k)
}

func cmdKeyRevoke(c cli, args []string) error {
	var k ops.KeyView
	if printed, err := c.call(http.MethodDelete, "/platform/keys/"+url.PathEscape(args[0]), nil, &k); printed || err != nil {
		return err
	}
	_, err := fmt.Fprintf(c.out, "Revoked %s of user %s at %s\n", k.ID, k.UserID, timeOr(k.RevokedAt, "-"))
	return err
}

func printKey(w io.Writer, k ops.KeyView) error {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintf(tw, "Key ID:\t%s\n", k.ID)
	fmt.Fprintf(tw, "User:\t%s\n", k.UserID)
	fmt.Fprintf(tw, "Status:\t%s\n", k.Status)
	fmt.Fprintf(tw, "Roles:\t%s\n", orDash(strings.Join(k.Roles, ",")))
	fmt.Fprintf(tw, "Label:\t%s\n", orDash(k.Label))
	fmt.Fprintf(tw, "Created:\t%s\n", timeOr(k.CreatedAt, "-"))
	fmt.Fprintf(tw, "Expires:\t%s\n", timeOr(k.ExpiresAt, "never"))
	if !k.RevokedAt.IsZero() {
		fmt.Fprintf(tw, "Revoked:\t%s\n", timeOr(k.RevokedAt, "-"))
	}
	return tw.Flush()
}

// subscriptionPath is the admin path of a user's subscription to a service.
func subscriptionPath(c cli) (string, error) {
	user, err := c.required("user")
	if err != nil {
		return "", err
	}
	service, err := c.required("service")
	if err != nil {
		return "", err
	}
	return "/platform/subscriptions/" + url.PathEscape(user) + "/" + url.PathEscape(service), nil
}

// subscriptionView is the subscription as the admin API returns it, with
// the credit balance kept as the exact decimal it was sent as.
type subscriptionView struct {
	UserID      string      `json:"userId"`
	ServiceID   string      `json:"serviceId"`
	ProductID   string      `json:"productId"`
	Status      string      `json:"status"`
	StartedAt   time.Time   `json:"startedAt"`
	Credits     json.Number `json:"credits"`
	CreditsHeld json.Number `json:"creditsHeld"`
	// The answer to a change (PUT) also has these.
	PreviousProductID string     `json:"previousProductId"`
	CurrentPeriod     *cliPeriod `json:"currentPeriod"`
}

func cmdSubscribe(c cli, _ []string) error {
	path, err := subscriptionPath(c)
	if err != nil {
		return err
	}
	product, err := c.required("product")
	if err != nil {
		return err
	}
	body := map[string]string{"productId": product, "status": c.fl.String("status")}
	var s subscriptionView
	if printed, err := c.call(http.MethodPut, path, body, &s); printed || err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.out, "User %s is subscribed to service %s, product %s, status %s (since %s, credits %s)\n",
		s.UserID, s.ServiceID, s.ProductID, s.Status, timeOr(s.StartedAt, "-"), s.Credits)
	if err != nil || s.CurrentPeriod == nil || s.CurrentPeriod.ProductMissing {
		return err
	}
	p := s.CurrentPeriod
	if s.PreviousProductID != "" {
		fmt.Fprintf(c.out, "Product changed from %s to %s, effective at once; the usage already counted in the period below stays.\n",
			s.PreviousProductID, s.ProductID)
	}
	_, err = fmt.Fprintf(c.out, "Current period %s to %s: %s\n", timeOr(p.PeriodStart, "-"), timeOr(p.PeriodEnd, "-"), p.usedLine())
	return err
}

func cmdCreditsAdd(c cli, _ []string) error {
	path, err := subscriptionPath(c)
	if err != nil {
		return err
	}
	amount, err := c.required("amount")
	if err != nil {
		return err
	}
	// Sent as a string, so the decimal reaches the server exactly as typed.
	var s subscriptionView
	if printed, err := c.call(http.MethodPost, path+"/credits", map[string]string{"amount": amount}, &s); printed || err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.out, "Credits of user %s on service %s: %s\n", s.UserID, s.ServiceID, s.Credits)
	return err
}

func cmdUsage(c cli, _ []string) error {
	q := url.Values{}
	if c.fl.Bool("json") && !c.fl.Changed("format") {
		q.Set("format", formatJSON)
	}
	for flag, param := range map[string]string{"user": "userId", "service": "serviceId", "from": "from", "to": "to", "format": "format",
		"rollup": "rollup"} {
		if v := c.fl.String(flag); v != "" && (flag != "format" || !q.Has("format")) {
			q.Set(param, v)
		}
	}
	// The admin endpoint is usually on this machine, where compressing
	// costs CPU on both ends and saves nothing; --gzip asks for it (Go's
	// client unpacks it) for a remote one.
	q.Set("gzip", strconv.FormatBool(c.fl.Bool("gzip")))
	resp, err := c.request(http.MethodGet, "/platform/usage?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	// Streamed through: the export may be larger than memory. Progress
	// goes to standard error (command_ledger.go).
	pw := newProgressWriter(c.out)
	if _, err := io.Copy(pw, resp.Body); err != nil {
		return fmt.Errorf("usage export interrupted: %v", err)
	}
	pw.report(true)
	return nil
}

func cmdJob(c cli, args []string) error {
	var job json.RawMessage
	if printed, err := c.call(http.MethodGet, "/platform/jobs/"+url.PathEscape(args[0]), nil, &job); printed || err != nil {
		return err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, job, "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err := c.out.Write(out.Bytes())
	return err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func timeOr(t time.Time, zero string) string {
	if t.IsZero() {
		return zero
	}
	return t.UTC().Format(time.RFC3339)
}
