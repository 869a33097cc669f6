package platform

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
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
	case len(p) == 4 && p[0] == "subscriptions" && p[3] == "grants":
		return map[string]adminHandler{http.MethodGet: a.listGrants}, p[1:3]
	case len(p) == 1 && p[0] == "usage":
		return map[string]adminHandler{http.MethodGet: a.exportUsage}, nil
	case len(p) == 2 && p[0] == "usage" && p[1] == "prune":
		return map[string]adminHandler{http.MethodPost: a.pruneUsage}, nil
	case len(p) == 1 && p[0] == "outcomes":
		return map[string]adminHandler{http.MethodGet: a.exportOutcomes}, nil
	case len(p) == 2 && p[0] == "outcomes" && p[1] == "summary":
		return map[string]adminHandler{http.MethodGet: a.outcomeSummary}, nil
	case len(p) == 1 && p[0] == "audit":
		return map[string]adminHandler{http.MethodGet: a.listAudit}, nil
	case len(p) == 2 && p[0] == "stripe" && p[1] == "reconcile":
		return map[string]adminHandler{http.MethodGet: a.stripeReconcile}, nil
	case len(p) == 2 && p[0] == "jobs":
		return map[string]adminHandler{http.MethodGet: a.getJob}, p[1:]
	case len(p) == 2 && p[0] == "stripe" && p[1] == "sync":
		return map[string]adminHandler{http.MethodPost: a.stripeSync}, nil
	case len(p) == 2 && p[0] == "stripe" && p[1] == "resync":
		return map[string]adminHandler{http.MethodPost: a.stripeResync}, nil
	case len(p) == 2 && p[0] == "stripe" && p[1] == "notgranted":
		return map[string]adminHandler{http.MethodGet: a.listNotGranted}, nil
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
		if name := duplicateField(raw); name != "" {
			return apierror.Invalid(name, name+" is given more than once")
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

// duplicateField returns the first name an object of raw (one valid JSON
// value) gives twice, compared as encoding/json matches names (without
// regard to case), or "". encoding/json keeps the last of them, so
// {"amount": 1, "amount": 1000} credited 1000 where whoever read the
// first saw 1.
func duplicateField(raw []byte) string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	var stack []map[string]bool // the names of each open object; nil for an array
	key := false                // the next token is a name of the innermost object
	for {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			key = len(stack) > 0 && stack[len(stack)-1] != nil
			continue
		}
		if name, ok := tok.(string); ok && key {
			folded := strings.ToLower(strings.ToUpper(name))
			if stack[len(stack)-1][folded] {
				return name
			}
			stack[len(stack)-1][folded] = true
			key = false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack, key = append(stack, map[string]bool{}), true
		case json.Delim('['):
			stack, key = append(stack, nil), false
		default:
			key = len(stack) > 0 && stack[len(stack)-1] != nil
		}
	}
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

// createKey: POST /platform/keys {userId, roles?, label?, expiresAt?}.
func (a *adminAPI) createKey(app *App, w http.ResponseWriter, r *http.Request, _ []string) error {
	var req ops.CreateKeyRequest
	if err := decodeBody(w, r, &req); err != nil {
		return err
	}
	// The key is stored with its audit entry, in one transaction: an
	// error made no key.
	v, err := app.ops.CreateKey(r.Context(), adminActor(r), req)
	if err != nil {
		return err
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
		if err := ops.CheckUserID("userId", userID); err != nil {
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
		Keys []ops.KeyView `json:"keys"`
	}{Keys: make([]ops.KeyView, 0, len(recs))}
	for _, k := range recs {
		out.Keys = append(out.Keys, ops.ViewKey(k, now))
	}
	return writeJSON(w, http.StatusOK, out)
}

// getKey: GET /platform/keys/{keyId}.
func (a *adminAPI) getKey(app *App, w http.ResponseWriter, r *http.Request, args []string) error {
	k, err := app.DataStore().KeyByID(r.Context(), args[0])
	if errors.Is(err, store.ErrNotFound) {
		return ops.KeyNotFound(args[0])
	}
	if err != nil {
		return fmt.Errorf("read key %s: %w", args[0], err)
	}
	return writeJSON(w, http.StatusOK, ops.ViewKey(k, app.Now()))
}

// revokeKey: DELETE /platform/keys/{keyId}. Revoking again answers the
// same record with the first revocation time.
func (a *adminAPI) revokeKey(app *App, w http.ResponseWriter, r *http.Request, args []string) error {
	v, err := app.ops.RevokeKey(r.Context(), adminActor(r), args[0])
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, v)
}

// putSubscription: PUT /platform/subscriptions/{userId}/{serviceId}
// {productId, status?}. It creates or replaces the subscription; the start
// (the anchor of its billing periods) and the credit balance are kept.
func (a *adminAPI) putSubscription(app *App, w http.ResponseWriter, r *http.Request, args []string) error {
	if _, _, err := ops.SubscriptionIDs(args); err != nil {
		return err
	}
	var req struct {
		ProductID string `json:"productId"`
		Status    string `json:"status"`
	}
	if err := decodeBody(w, r, &req); err != nil {
		return err
	}
	out, err := app.ops.PutSubscription(r.Context(), adminActor(r), args[0], args[1], req.ProductID, req.Status)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}

// getSubscription: GET /platform/subscriptions/{userId}/{serviceId}.
func (a *adminAPI) getSubscription(app *App, w http.ResponseWriter, r *http.Request, args []string) error {
	userID, serviceID, err := ops.SubscriptionIDs(args)
	if err != nil {
		return err
	}
	sub, err := app.DataStore().GetSubscription(r.Context(), userID, serviceID)
	if errors.Is(err, store.ErrNoAccount) || errors.Is(err, store.ErrNotFound) {
		return ops.SubscriptionNotFound(userID, serviceID)
	}
	if err != nil {
		return fmt.Errorf("read subscription of %s to %s: %w", userID, serviceID, err)
	}
	return writeJSON(w, http.StatusOK, ops.ViewSubscription(sub))
}

// addCredits: POST /platform/subscriptions/{userId}/{serviceId}/credits
// {amount}. A negative amount corrects an earlier top-up; the balance may
// go below zero, which records what the user owes.
func (a *adminAPI) addCredits(app *App, w http.ResponseWriter, r *http.Request, args []string) error {
	if _, _, err := ops.SubscriptionIDs(args); err != nil {
		return err
	}
	var req struct {
		Amount json.RawMessage `json:"amount"`
	}
	if err := decodeBody(w, r, &req); err != nil {
		return err
	}
	amount, err := ops.ParseCreditAmount(string(req.Amount))
	if err != nil {
		return err
	}
	sub, err := app.ops.AddCredits(r.Context(), adminActor(r), args[0], args[1], amount)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, ops.ViewSubscription(sub))
}

// listGrants: GET /platform/subscriptions/{userId}/{serviceId}/grants,
// the subscription's credit grants oldest first (bought credits, what
// refunds and disputes took back of each, what expired), so an operator
// can check a balance against what Stripe was paid.
func (a *adminAPI) listGrants(app *App, w http.ResponseWriter, r *http.Request, args []string) error {
	userID, serviceID, err := ops.SubscriptionIDs(args)
	if err != nil {
		return err
	}
	if _, err := app.DataStore().GetSubscription(r.Context(), userID, serviceID); errors.Is(err, store.ErrNoAccount) || errors.Is(err, store.ErrNotFound) {
		return ops.SubscriptionNotFound(userID, serviceID)
	} else if err != nil {
		return fmt.Errorf("read subscription of %s to %s: %w", userID, serviceID, err)
	}
	out := struct {
		Grants []ops.GrantRecord `json:"grants"`
	}{Grants: []ops.GrantRecord{}}
	if pay, ok := app.DataStore().(store.Payments); ok {
		gs, err := pay.ListCreditGrants(r.Context(), userID, serviceID)
		if err != nil {
			return fmt.Errorf("read the credit grants of %s on %s: %w", userID, serviceID, err)
		}
		for _, g := range gs {
			out.Grants = append(out.Grants, ops.ViewGrant(g))
		}
	}
	return writeJSON(w, http.StatusOK, out)
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
	v := ops.ViewJob(j)
	if j.Cost != 0 {
		v.CostUnit = ops.CostUnit(app.Catalog(), j.ServiceID, j.ProductID)
	}
	return writeJSON(w, http.StatusOK, v)
}

// Interface guards.
var (
	_ caddy.Provisioner = (*adminAPI)(nil)
	_ caddy.AdminRouter = (*adminAPI)(nil)
)
