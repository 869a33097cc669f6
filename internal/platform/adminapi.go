package platform

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/wire"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPIBase is where the platform's routes live on Caddy's admin
// endpoint, next to /config/ and /pki/.
const adminAPIBase = "/platform/"

// maxAdminBody caps an admin request body; the largest legitimate one (a
// key with its roles and label) is a few hundred bytes.
const maxAdminBody = 1 << 20

// codeNotConfigured answers every route while the running config has no
// platform app; it is an operator's error, so it lives here and not in the
// wire contract's codes.
const codeNotConfigured = "platform_not_configured"

// adminAPI is the admin.api.platform module: the operator's routes for
// service keys, subscriptions, credits, the usage ledger and async jobs.
type adminAPI struct {
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.platform",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

// Provision sets up the logger.
func (a *adminAPI) Provision(ctx caddy.Context) error {
	// Passing the module is how an admin router gets a logger named after
	// it (the admin API is not yet an ordinary module tree; see caddypki).
	a.logger = ctx.Logger(a)
	return nil
}

// runningApp is the platform app of the config Caddy is running, or nil.
//
// It is looked up per request instead of being taken from the context
// this module was provisioned with, because Caddy swaps in the admin
// handler of a config before that config's apps start, and keeps it when
// the config then fails to load: the app of that context may not have
// started yet, or may have failed and been cleaned up while the previous
// config, and its app, keep running. The running config's apps are all
// provisioned before it becomes the running one, so this only reads.
func runningApp() *App {
	app, err := caddy.ActiveContext().AppIfConfigured("platform")
	if err != nil {
		return nil
	}
	a, _ := app.(*App)
	return a
}

// Routes returns the admin routes of the platform.
func (a *adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{
		Pattern: adminAPIBase,
		Handler: caddy.AdminHandlerFunc(a.serve),
	}}
}

// adminHandler answers one route; args are the unescaped path parameters.
// A returned *apierror.Error is written as is, any other error as a 500.
type adminHandler func(app *App, w http.ResponseWriter, r *http.Request, args []string) error

// route finds the handlers of a path (split below /platform/) by method, and
// the path parameters.
func (a *adminAPI) route(p []string) (map[string]adminHandler, []string) {
	switch {
	case len(p) == 1 && p[0] == "keys":
		return map[string]adminHandler{http.MethodPost: a.createKey, http.MethodGet: a.listKeys}, nil
	case len(p) == 2 && p[0] == "keys":
		return map[string]adminHandler{http.MethodGet: a.getKey, http.MethodDelete: a.revokeKey}, p[1:]
	case len(p) == 1 && p[0] == "subscriptions":
		return map[string]adminHandler{http.MethodGet: a.listSubscriptions}, nil
	case len(p) == 2 && p[0] == "subscriptions":
		return map[string]adminHandler{http.MethodGet: a.listUserSubscriptions}, p[1:]
	case len(p) == 3 && p[0] == "users" && p[2] == "summary":
		return map[string]adminHandler{http.MethodGet: a.getUserSummary}, p[1:2]
	case len(p) == 1 && p[0] == "jobs":
		return map[string]adminHandler{http.MethodGet: a.listJobs}, nil
	case len(p) == 1 && p[0] == "alerts":
		return map[string]adminHandler{http.MethodGet: a.listAlerts}, nil
	case len(p) == 3 && p[0] == "subscriptions":
		return map[string]adminHandler{http.MethodGet: a.getSubscription, http.MethodPut: a.putSubscription}, p[1:]
	case len(p) == 4 && p[0] == "subscriptions" && p[3] == "credits":
		return map[string]adminHandler{http.MethodPost: a.addCredits}, p[1:3]
	case len(p) == 1 && p[0] == "usage":
		return map[string]adminHandler{http.MethodGet: a.exportUsage}, nil
	case len(p) == 2 && p[0] == "usage" && p[1] == "prune":
		return map[string]adminHandler{http.MethodPost: a.pruneUsage}, nil
	case len(p) == 1 && p[0] == "audit":
		return map[string]adminHandler{http.MethodGet: a.listAudit}, nil
	case len(p) == 2 && p[0] == "jobs":
		return map[string]adminHandler{http.MethodGet: a.getJob}, p[1:]
	}
	return nil, nil
}

// serve dispatches a request under /platform/. Errors are written here as
// the gateway's JSON error (Caddy's admin error body has another shape), so
// nil goes back to Caddy.
func (a *adminAPI) serve(w http.ResponseWriter, r *http.Request) error {
	app := runningApp()
	if app == nil {
		writeErrorStatus(w, http.StatusServiceUnavailable, apierror.New(codeNotConfigured,
			"the running config has no platform app; add a platform block (or apps.platform) and reload"))
		return nil
	}
	parts, ok := splitAdminPath(r.URL.EscapedPath())
	handlers, args := a.route(parts)
	if !ok || handlers == nil {
		apierror.Write(w, apierror.New(apierror.NotFound, "no admin route "+r.URL.Path))
		return nil
	}
	h, ok := handlers[r.Method]
	if !ok {
		allow := make([]string, 0, len(handlers))
		for m := range handlers {
			allow = append(allow, m)
		}
		slices.Sort(allow)
		w.Header().Set("Allow", strings.Join(allow, ", "))
		apierror.Write(w, apierror.New(apierror.MethodNotAllowed, r.Method+" is not allowed on "+r.URL.Path))
		return nil
	}
	if err := h(app, w, r, args); err != nil {
		a.writeError(w, r, err)
	}
	return nil
}

// splitAdminPath returns the unescaped segments below /platform/, tolerating
// one trailing slash; false when a segment is empty or badly escaped.
func splitAdminPath(escaped string) ([]string, bool) {
	rest := strings.TrimPrefix(escaped, adminAPIBase)
	rest = strings.TrimSuffix(rest, "/")
	if rest == "" {
		return nil, false
	}
	parts := strings.Split(rest, "/")
	for i, p := range parts {
		u, err := url.PathUnescape(p)
		if err != nil || u == "" {
			return nil, false
		}
		parts[i] = u
	}
	return parts, true
}

func (a *adminAPI) writeError(w http.ResponseWriter, r *http.Request, err error) {
	var ae *apierror.Error
	if errors.As(err, &ae) {
		apierror.Write(w, ae)
		return
	}
	a.logger.Error("admin request failed",
		zap.String("method", r.Method),
		zap.String("path", r.URL.Path),
		zap.Error(err))
	apierror.Write(w, apierror.New(apierror.InternalError, "internal error; see the server log"))
}

// writeErrorStatus writes e through apierror, the one place error bodies
// are built, but with a status its code does not map to.
func writeErrorStatus(w http.ResponseWriter, status int, e *apierror.Error) {
	apierror.Write(statusWriter{w, status}, e)
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s statusWriter) WriteHeader(int) { s.ResponseWriter.WriteHeader(s.status) }

func writeJSON(w http.ResponseWriter, status int, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode response: %w", err)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	// A new key is in this body: no cache may keep it.
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, err = w.Write(append(body, '\n'))
	return err
}

// decodeBody reads a JSON object of at most maxAdminBody bytes into v,
// refusing unknown fields and trailing data, so a typo in a field name is
// an error instead of a silently ignored setting.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAdminBody))
	// encoding/json turns bytes that are not UTF-8 into U+FFFD, so "u\xff"
	// and "u\xfe" both became the user "u\uFFFD": a key or subscription
	// silently made for an id nobody sent, and shared by both.
	if err == nil && !utf8.Valid(raw) {
		return apierror.Invalid("body", "the body must be UTF-8 JSON")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err == nil {
		err = dec.Decode(v)
	}
	if err == nil {
		if dec.Decode(new(json.RawMessage)) != io.EOF {
			return apierror.Invalid("body", "the body must hold exactly one JSON object")
		}
		return nil
	}
	var (
		tooLarge *http.MaxBytesError
		typeErr  *json.UnmarshalTypeError
		syntax   *json.SyntaxError
	)
	switch {
	case errors.As(err, &tooLarge):
		return apierror.New(apierror.PayloadTooLarge, "the body exceeds 1 MiB")
	case errors.Is(err, io.EOF):
		return apierror.Invalid("body", "a JSON object is required")
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			return apierror.Invalid("body", "the body must be a JSON object")
		}
		return apierror.Invalid(field, field+" must be a JSON "+jsonKind(typeErr.Type))
	case errors.As(err, &syntax), errors.Is(err, io.ErrUnexpectedEOF):
		return apierror.Invalid("body", "malformed JSON: "+err.Error())
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name = strings.Trim(name, `"`)
		return apierror.Invalid(name, "unknown field "+name)
	}
	return apierror.Invalid("body", err.Error())
}

func jsonKind(t interface{ String() string }) string {
	switch s := t.String(); {
	case s == "string", s == "time.Time":
		return "string"
	case strings.HasPrefix(s, "[]"):
		return "array"
	default:
		return "value of type " + s
	}
}

// checkQuery refuses query parameters a route does not know, or repeated
// ones: a misspelt filter must not silently export everyone's usage.
func checkQuery(q url.Values, known ...string) error {
	for name, vals := range q {
		if !slices.Contains(known, name) {
			return apierror.Invalid(name, "unknown query parameter "+name+"; expected one of "+strings.Join(known, ", "))
		}
		if len(vals) > 1 {
			return apierror.Invalid(name, name+" given more than once")
		}
	}
	return nil
}

// Limits of the operator-supplied values of a key.
const (
	maxRoleLen  = 64
	maxRoles    = 32
	maxLabelLen = 256
)

// ValidUserID reports whether s can be a user id (wire.ValidUserID, the
// one rule for user ids: the admin API, the console, the usage routes and
// the catalog's owners all use it).
func ValidUserID(s string) bool { return wire.ValidUserID(s) }

func checkUserID(field, s string) error {
	if !ValidUserID(s) {
		return apierror.Invalid(field, field+" must be "+wire.UserIDRule)
	}
	return nil
}

// checkRoles validates roles: visible ASCII without ',' (they are sent
// comma-joined in a header and in the signed context, where a comma inside
// a role would split it). Duplicates are dropped, order is kept.
func checkRoles(roles []string) ([]string, error) {
	if len(roles) > maxRoles {
		return nil, apierror.Invalid("roles", fmt.Sprintf("at most %d roles", maxRoles))
	}
	out := make([]string, 0, len(roles))
	for _, role := range roles {
		if role == "" || len(role) > maxRoleLen {
			return nil, apierror.Invalid("roles", fmt.Sprintf("a role is 1 to %d characters", maxRoleLen))
		}
		for i := 0; i < len(role); i++ {
			if c := role[i]; c <= ' ' || c > '~' || c == ',' {
				return nil, apierror.Invalid("roles", fmt.Sprintf("role %q: visible ASCII characters other than ',' only", role))
			}
		}
		if !slices.Contains(out, role) {
			out = append(out, role)
		}
	}
	return out, nil
}

func checkLabel(s string) error {
	if len(s) > maxLabelLen || !utf8.ValidString(s) {
		return apierror.Invalid("label", fmt.Sprintf("label must be UTF-8 text of at most %d bytes", maxLabelLen))
	}
	for _, c := range s {
		if unicode.IsControl(c) {
			return apierror.Invalid("label", "label must not hold control characters")
		}
	}
	return nil
}

// keyView is a service key as the admin API shows it: never the key's hash,
// and the key itself only in the response that created it.
type keyView struct {
	ID        string    `json:"keyId"`
	Key       string    `json:"key,omitempty"`
	UserID    string    `json:"userId"`
	Roles     []string  `json:"roles"`
	Label     string    `json:"label"`
	Status    string    `json:"status"`
	CreatedAt time.Time `json:"createdAt"`
	ExpiresAt time.Time `json:"expiresAt,omitzero"`
	RevokedAt time.Time `json:"revokedAt,omitzero"`
	// ParentKeyID is the key a caller made this one under in the portal;
	// EndsWithParent says revoking that one revokes this one too.
	ParentKeyID    string `json:"parentKeyId,omitempty"`
	EndsWithParent bool   `json:"endsWithParent,omitempty"`
}

// Key statuses shown by the admin API.
const (
	keyActive  = string(servicekey.Active)
	keyRevoked = string(servicekey.Revoked)
)

func viewKey(k store.KeyRecord, now time.Time) keyView {
	v := keyView{
		ID: k.ID, UserID: k.UserID, Roles: k.Roles, Label: k.Label,
		Status: KeyStatus(k, now), CreatedAt: k.Created, ExpiresAt: k.ExpiresAt, RevokedAt: k.RevokedAt,
		ParentKeyID: k.ParentKeyID, EndsWithParent: k.EndsWithParent,
	}
	if v.Roles == nil {
		v.Roles = []string{}
	}
	return v
}

// createKey: POST /platform/keys {userId, roles?, label?, expiresAt?}.
func (a *adminAPI) createKey(app *App, w http.ResponseWriter, r *http.Request, _ []string) error {
	var req CreateKeyRequest
	if err := decodeBody(w, r, &req); err != nil {
		return err
	}
	v, err := app.CreateKey(r.Context(), adminActor(r), req)
	if v.ID == "" {
		return err
	}
	if err != nil {
		// The key exists: it is shown (once) even though its audit entry
		// failed, which the server log says.
		a.logger.Error("key created without its audit entry", zap.String("key_id", v.ID))
	}
	w.Header().Set("Location", adminAPIBase+"keys/"+url.PathEscape(v.ID))
	return writeJSON(w, http.StatusCreated, v)
}

// adminActor names the caller of the admin API in the audit log.
func adminActor(r *http.Request) string { return "admin-api " + r.RemoteAddr }

// listKeys: GET /platform/keys[?userId=], oldest first.
func (a *adminAPI) listKeys(app *App, w http.ResponseWriter, r *http.Request, _ []string) error {
	q := r.URL.Query()
	if err := checkQuery(q, "userId"); err != nil {
		return err
	}
	userID := q.Get("userId")
	if q.Has("userId") {
		if err := checkUserID("userId", userID); err != nil {
			return err
		}
	}
	recs, err := app.DataStore().ListKeys(r.Context(), userID)
	if err != nil {
		return fmt.Errorf("list keys: %w", err)
	}
	slices.SortFunc(recs, func(x, y store.KeyRecord) int {
		if c := x.Created.Compare(y.Created); c != 0 {
			return c
		}
		return strings.Compare(x.ID, y.ID)
	})
	now := app.Now()
	out := struct {
		Keys []keyView `json:"keys"`
	}{Keys: make([]keyView, 0, len(recs))}
	for _, k := range recs {
		out.Keys = append(out.Keys, viewKey(k, now))
	}
	return writeJSON(w, http.StatusOK, out)
}

func keyNotFound(id string) error {
	return apierror.New(apierror.NotFound, "no service key "+apierror.QuoteID(id))
}

// getKey: GET /platform/keys/{keyId}.
func (a *adminAPI) getKey(app *App, w http.ResponseWriter, r *http.Request, args []string) error {
	k, err := app.DataStore().KeyByID(r.Context(), args[0])
	if errors.Is(err, store.ErrNotFound) {
		return keyNotFound(args[0])
	}
	if err != nil {
		return fmt.Errorf("read key %s: %w", args[0], err)
	}
	return writeJSON(w, http.StatusOK, viewKey(k, app.Now()))
}

// revokeKey: DELETE /platform/keys/{keyId}. Revoking again answers the
// same record with the first revocation time.
func (a *adminAPI) revokeKey(app *App, w http.ResponseWriter, r *http.Request, args []string) error {
	v, err := app.RevokeKey(r.Context(), adminActor(r), args[0])
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, v)
}

// subscriptionIDs validates the {userId}/{serviceId} of a subscription path.
func subscriptionIDs(args []string) (userID, serviceID string, err error) {
	userID, serviceID = args[0], args[1]
	if err := checkUserID("userId", userID); err != nil {
		return "", "", err
	}
	if !catalog.ValidID(serviceID) {
		return "", "", apierror.Invalid("serviceId", "serviceId is not a valid id")
	}
	return userID, serviceID, nil
}

func subscriptionNotFound(userID, serviceID string) error {
	return apierror.New(apierror.NotFound, "user "+apierror.QuoteID(userID)+" has no subscription to service "+serviceID)
}

// putSubscription: PUT /platform/subscriptions/{userId}/{serviceId}
// {productId, status?}. It creates or replaces the subscription; the start
// (the anchor of its billing periods) and the credit balance are kept.
func (a *adminAPI) putSubscription(app *App, w http.ResponseWriter, r *http.Request, args []string) error {
	if _, _, err := subscriptionIDs(args); err != nil {
		return err
	}
	var req struct {
		ProductID string `json:"productId"`
		Status    string `json:"status"`
	}
	if err := decodeBody(w, r, &req); err != nil {
		return err
	}
	out, err := app.PutSubscription(r.Context(), adminActor(r), args[0], args[1], req.ProductID, req.Status)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}

// getSubscription: GET /platform/subscriptions/{userId}/{serviceId}.
func (a *adminAPI) getSubscription(app *App, w http.ResponseWriter, r *http.Request, args []string) error {
	userID, serviceID, err := subscriptionIDs(args)
	if err != nil {
		return err
	}
	sub, err := app.DataStore().GetSubscription(r.Context(), userID, serviceID)
	if errors.Is(err, store.ErrNoAccount) || errors.Is(err, store.ErrNotFound) {
		return subscriptionNotFound(userID, serviceID)
	}
	if err != nil {
		return fmt.Errorf("read subscription of %s to %s: %w", userID, serviceID, err)
	}
	return writeJSON(w, http.StatusOK, viewSubscription(sub))
}

// addCredits: POST /platform/subscriptions/{userId}/{serviceId}/credits
// {amount}. A negative amount corrects an earlier top-up; the balance may
// go below zero, which records what the user owes.
func (a *adminAPI) addCredits(app *App, w http.ResponseWriter, r *http.Request, args []string) error {
	if _, _, err := subscriptionIDs(args); err != nil {
		return err
	}
	var req struct {
		Amount json.RawMessage `json:"amount"`
	}
	if err := decodeBody(w, r, &req); err != nil {
		return err
	}
	amount, err := ParseCreditAmount(string(req.Amount))
	if err != nil {
		return err
	}
	sub, err := app.AddCredits(r.Context(), adminActor(r), args[0], args[1], amount)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, viewSubscription(sub))
}

// parseSignedUnits reads a JSON number (or a string holding one) that may
// be negative, exactly, without going through float64.
func parseSignedUnits(raw json.RawMessage) (billing.Units, error) {
	s := string(raw)
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		s = s[1 : len(s)-1]
	}
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	if s == "" || s[0] == '+' || s[0] == '-' {
		return 0, billing.ErrInvalidUnits
	}
	u, err := billing.ParseUnits(s)
	if err != nil {
		return 0, err
	}
	if neg {
		u = -u
	}
	return u, nil
}

// getJob: GET /platform/jobs/{requestId}, the job as operators see it.
func (a *adminAPI) getJob(app *App, w http.ResponseWriter, r *http.Request, args []string) error {
	j, err := app.DataStore().GetJob(r.Context(), args[0])
	if errors.Is(err, store.ErrNotFound) {
		return apierror.New(apierror.RequestNotFound, "no job "+apierror.QuoteID(args[0]))
	}
	if err != nil {
		return fmt.Errorf("read job %s: %w", args[0], err)
	}
	return writeJSON(w, http.StatusOK, viewJob(j))
}

// Interface guards.
var (
	_ caddy.Provisioner = (*adminAPI)(nil)
	_ caddy.AdminRouter = (*adminAPI)(nil)
)

// Usage export formats.
const (
	formatJSON   = "json"   // one JSON array, written entry by entry
	formatNDJSON = "ndjson" // one JSON object per line
	formatCSV    = "csv"    // a header row, then one row per entry
)

// usageColumns are the CSV columns, named like the JSON fields.
var usageColumns = []string{
	"time", "id", "userId", "serviceId", "endpointId", "productId", "requestId",
	"source", "units", "overage", "cost", "unitsClaimed", "occurredAt", "idempotencyKey", "unitsUncharged",
}

// exportUsage: GET /platform/usage?userId=&serviceId=&from=&to=&format=
// &rollup=hour&gzip=. It streams the ledger in time order straight from
// the store's chunked scan to the client, so a ledger of any size is
// exported in bounded memory; rollup=hour exports the hourly rollups
// instead (adminapi_ledger.go), gzip compresses either.
func (a *adminAPI) exportUsage(app *App, w http.ResponseWriter, r *http.Request, _ []string) error {
	q := r.URL.Query()
	if err := checkQuery(q, "userId", "serviceId", "from", "to", "format", "gzip", "rollup"); err != nil {
		return err
	}
	f := store.LedgerFilter{UserID: q.Get("userId"), ServiceID: q.Get("serviceId")}
	if q.Has("userId") {
		if err := checkUserID("userId", f.UserID); err != nil {
			return err
		}
	}
	if q.Has("serviceId") && !catalog.ValidID(f.ServiceID) {
		return apierror.Invalid("serviceId", "serviceId is not a valid id")
	}
	var err error
	if f.From, err = parseTimeBound(q.Get("from"), false); err != nil {
		return apierror.Invalid("from", "from must be an RFC 3339 time or a date (YYYY-MM-DD)")
	}
	if f.To, err = parseTimeBound(q.Get("to"), true); err != nil {
		return apierror.Invalid("to", "to must be an RFC 3339 time or a date (YYYY-MM-DD)")
	}
	if !f.From.IsZero() && !f.To.IsZero() && !f.From.Before(f.To) {
		return apierror.Invalid("to", "to must be after from")
	}
	format := strings.ToLower(q.Get("format"))
	if format == "" {
		format = formatJSON
	}
	if q.Has("rollup") && q.Get("rollup") != rollupHour {
		return apierror.Invalid("rollup", "rollup must be hour (hourly sums per subscription, endpoint and product)")
	}
	var enc ledgerEncoder
	switch format {
	case formatJSON:
		enc = &jsonArrayEncoder{}
	case formatNDJSON:
		enc = &ndjsonEncoder{}
	case formatCSV:
		enc = &csvEncoder{}
	default:
		return apierror.Invalid("format", "format must be json, ndjson or csv")
	}

	gz, err := wantGzip(r)
	if err != nil {
		return err
	}
	if q.Has("rollup") {
		return a.exportRollups(app, w, r, f, format, gz)
	}
	filename := ""
	if format == formatCSV {
		filename = "usage.csv"
	}
	return streamExport(a, w, r, enc, filename, gz, func(fn func(store.LedgerEntry) error) error {
		return app.DataStore().ScanLedger(r.Context(), f, fn)
	})
}

// parseTimeBound reads an RFC 3339 time or a date. A date as the upper
// bound means the end of that day, so from=2026-01-01&to=2026-01-31 is all
// of January.
func parseTimeBound(s string, upper bool) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.Parse(time.DateOnly, s)
	if err != nil {
		return time.Time{}, err
	}
	if upper {
		d = d.AddDate(0, 0, 1)
	}
	return d, nil
}

// lazyWriter calls start before its first write.
type lazyWriter struct {
	w       io.Writer
	start   func()
	started bool
}

func (l *lazyWriter) Write(p []byte) (int, error) {
	if !l.started {
		l.started = true
		l.start()
	}
	return l.w.Write(p)
}

// newFlushWriter buffers small entry writes into larger chunks.
func newFlushWriter(w io.Writer) *bufio.Writer { return bufio.NewWriterSize(w, 32<<10) }

// ledgerEncoder writes ledger entries in one export format.
type ledgerEncoder interface {
	contentType() string
	begin(w io.Writer) error
	entry(w io.Writer, e store.LedgerEntry) error
	end(w io.Writer) error
}

type jsonArrayEncoder struct{ n int }

func (*jsonArrayEncoder) contentType() string { return "application/json" }
func (*jsonArrayEncoder) begin(w io.Writer) error {
	_, err := io.WriteString(w, "[")
	return err
}

func (j *jsonArrayEncoder) entry(w io.Writer, e store.LedgerEntry) error {
	b, err := UsageJSON(e)
	if err != nil {
		return err
	}
	sep := ",\n"
	if j.n == 0 {
		sep = "\n"
	}
	j.n++
	if _, err := io.WriteString(w, sep); err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

func (j *jsonArrayEncoder) end(w io.Writer) error {
	closing := "\n]\n"
	if j.n == 0 {
		closing = "]\n"
	}
	_, err := io.WriteString(w, closing)
	return err
}

type ndjsonEncoder struct{}

func (ndjsonEncoder) contentType() string   { return "application/x-ndjson" }
func (ndjsonEncoder) begin(io.Writer) error { return nil }
func (ndjsonEncoder) end(io.Writer) error   { return nil }
func (ndjsonEncoder) entry(w io.Writer, e store.LedgerEntry) error {
	b, err := UsageJSON(e)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

type csvEncoder struct{ cw *csv.Writer }

func (*csvEncoder) contentType() string { return "text/csv; charset=utf-8" }

func (c *csvEncoder) begin(w io.Writer) error {
	c.cw = csv.NewWriter(w)
	return c.cw.Write(usageColumns)
}

func (c *csvEncoder) entry(_ io.Writer, e store.LedgerEntry) error {
	return c.cw.Write(UsageCSVRow(e))
}

// UsageCSVColumns are the columns of a usage CSV export.
func UsageCSVColumns() []string { return slices.Clone(usageColumns) }

// UsageCSVRow is a ledger entry as a row of a usage CSV export, text
// fields defused against formula injection.
func UsageCSVRow(e store.LedgerEntry) []string {
	return []string{
		csvTime(e.Time),
		csvText(e.ID),
		csvText(e.UserID),
		csvText(e.ServiceID),
		csvText(e.EndpointID),
		csvText(e.ProductID),
		csvText(e.RequestID),
		csvText(e.Source),
		e.Units.String(),
		e.Overage.String(),
		e.Cost.String(),
		e.UnitsClaimed.String(),
		csvTime(e.OccurredAt),
		csvText(e.IdempotencyKey),
		e.Uncharged().String(),
	}
}

func (c *csvEncoder) end(io.Writer) error {
	c.cw.Flush()
	return c.cw.Error()
}

func csvTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// csvText defuses CSV formula injection: a spreadsheet runs a cell that
// starts with = + - @ (or a tab or carriage return that hides one) as a
// formula, and text fields such as user ids and idempotency keys come from
// outside. Such a value is prefixed with a single quote, which spreadsheets
// show as text, as OWASP recommends. Numbers are written by us and left
// alone.
func csvText(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return "'" + s
	}
	return s
}
