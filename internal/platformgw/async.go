package platformgw

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/signing"
	"github.com/platformgw/gateway/internal/store"
)

// invokeAsync starts an async job: the endpoint's cost is reserved and the
// job stored in one store transaction before anything reaches the backend,
// and the backend gets the signed JSON envelope with the progress and
// callback URLs. The backend's own answer never reaches the caller: a 2xx
// becomes the gateway's 202, anything else fails the job, which releases
// its reservation.
func (h *Handler) invokeAsync(w http.ResponseWriter, r *http.Request, c *call, next caddyhttp.Handler) error {
	urls := c.urls // built by admit, before anything was taken
	job := store.Job{
		ID:         c.requestID,
		UserID:     c.account.UserID,
		KeyID:      c.key.ID,
		ServiceID:  c.svc.ID,
		EndpointID: c.ep.ID,
		Free:       c.account.Free,
		Status:     store.JobPending,
		CreatedAt:  c.started.UTC(),
		UpdatedAt:  c.started.UTC(),
		ExpiresAt:  c.started.Add(time.Duration(h.rt.Limits.JobTTL)).UTC(),
		// The terms it is charged under whatever a reload does before it
		// completes: the endpoint's cost now, and the product it is held
		// under (the store records c.account's).
		Terms: &store.JobTerms{EndpointCost: c.ep.UnitCost()},
	}
	if c.product != nil {
		job.ProductID = c.product.ID
	}
	if e := h.createJob(r.Context(), c, job); e != nil {
		h.refuseCall(w, r, c, true, "rejected", e)
		return nil
	}
	h.rt.CountJobState(store.JobPending)

	// The payload travels as a JSON string: written with the same escaping
	// as the canonical string, so the backend rebuilds exactly the signed
	// bytes from what it parses.
	var env envelope
	canonical := env.start(c.requestID, string(c.body), urls)
	sig, ts := h.prepareForward(r, c, canonical, c.ep.Path)
	r.Header.Set("Content-Type", "application/json")
	r.Header.Del("Content-Encoding") // the envelope is plain JSON, whatever the caller's body was
	r.Header.Del("Upgrade")          // an async job is never a protocol switch
	// The envelope's Content-Type is the gateway's, not the caller's: a
	// caller's Connection naming it made the proxy drop it as hop-by-hop,
	// and the backend got the JSON envelope untyped.
	dropConnectionTokens(r.Header, "Content-Type")
	setBody(r, &c.fwd, env.finish(urls, sig, ts))

	ans := &backendAnswer{header: make(http.Header), r: r}
	err := serveCaptured(next, ans, r)
	if ans.status >= 200 && ans.status < 300 {
		h.accept(w, c, urls)
		return nil
	}
	if ans.callerGone && ans.status == 0 {
		// No refusal of the backend's: the caller left first, as a sync
		// call's caller may (invokeSync). The job fails, its hold goes.
		h.failJob(job, "the caller hung up before the service backend accepted the job")
		h.rt.CountKnownInvoke(c.svc.ID, c.ep.ID, "async", "caller_gone")
		w.WriteHeader(statusClientClosed) // for the access log, as the proxy does
		return nil
	}
	var refusal *apierror.Error
	var reason string
	if ans.status != 0 {
		reason = "the service backend refused the job (HTTP " + strconv.Itoa(ans.status) + ")"
		refusal = apierror.New(apierror.ServiceError, reason)
		h.logger.Warn("backend refused async job", zap.String("request_id", c.requestID),
			zap.String("service", c.svc.ID), zap.Int("status", ans.status))
	} else {
		refusal = h.unreachable(c, err)
		reason = refusal.Message
	}
	if h.failJob(job, reason) {
		// The backend completed the job (its completion taken and
		// charged) before it answered the forward with an error: it took
		// the job. A 502 would tell the caller of a charged, finished job
		// that it failed, and its retry would pay again.
		h.logger.Warn("backend completed the async job before refusing its forward; the caller is told it was accepted",
			zap.String("request_id", c.requestID), zap.String("service", c.svc.ID))
		h.accept(w, c, urls)
		return nil
	}
	h.refuseCall(w, r, c, true, "backend_error", refusal)
	return nil
}

// createJob reserves the endpoint's cost for the job and stores the job in
// the same store transaction, as a sync call reserves before it is
// forwarded: jobs started at once never hold more than a hard limit allows.
// The reservation belongs to the job and ends with it (completion, failure,
// expiry), surviving restarts. A refusal stores nothing and becomes the
// caller's error, with the codes a sync call gets.
func (h *Handler) createJob(ctx context.Context, c *call, job store.Job) *apierror.Error {
	hold := h.rt.HoldUnits(c.account, c.ep)
	res, err := h.rt.Jobs().CreateJobReserved(ctx, job, c.account, hold, c.started)
	if err == nil && !res.Decision.Allowed {
		if fit := c.refit(hold, res.State, &res.Decision); fit > 0 { // as a sync call
			res, err = h.rt.Jobs().CreateJobReserved(ctx, job, c.account, fit, c.started)
		}
	}
	if errors.Is(err, store.ErrNoAccount) {
		return apierror.New(apierror.NoSubscription, "no subscription to service "+c.svc.ID)
	}
	if errors.Is(err, store.ErrUnavailable) {
		return apierror.Unavailable()
	}
	if err != nil {
		h.logger.Error("create job", zap.String("request_id", c.requestID), zap.Error(err))
		return apierror.New(apierror.InternalError, "could not create the job")
	}
	return h.judge(c, res.Decision, res.State)
}

// jobURLs are the absolute URLs of a job, without query strings.
type jobURLs struct {
	status   string // {gw}/requests/{id}/status, what the caller polls
	progress string // {usage}/progress/{id}, what the backend posts progress to
	callback string // {usage}/complete/{id}, what the backend posts completion to
}

// jobURLs builds a job's URLs on the configured public URL, else on the
// scheme and Host the caller used, if that Host is one the server is
// configured for (knownHost): a backend posts its signed completion to the
// callback URL, so the caller's Host must not choose where it goes. The
// gateway prefix is the one the caller used; the usage prefix is the one
// in the same position of the prefix lists (so the ECS gateway prefix
// pairs with the ECS usage prefix), or the first.
func (h *Handler) jobURLs(r *http.Request, c *call) (jobURLs, *apierror.Error) {
	p := h.rt.Prefixes
	if len(p.Usage) == 0 {
		h.logger.Error("async invoke needs a usage prefix for the callback URLs")
		return jobURLs{}, apierror.New(apierror.InternalError, "async jobs are not configured: no usage prefix")
	}
	usage := p.Usage[0]
	if i := slices.Index(p.Gateway, c.route.prefix); i >= 0 && i < len(p.Usage) {
		usage = p.Usage[i]
	}
	base := h.rt.PublicURL
	if base == "" {
		if !knownHost(r) {
			return jobURLs{}, apierror.Invalid("Host", "async jobs are started only through a host name this gateway is configured for ("+
				apierror.QuoteID(r.Host)+" is not one); the operator sets public_url or the site's host names")
		}
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		base = scheme + "://" + r.Host
	}
	gw := base + strings.TrimSuffix(c.route.prefix, "/")
	us := base + strings.TrimSuffix(usage, "/")
	id := url.PathEscape(c.requestID)
	return jobURLs{
		status:   gw + "/requests/" + id + "/status",
		progress: us + "/progress/" + id,
		callback: us + "/complete/" + id,
	}, nil
}

// knownHost reports whether the request's Host names this server: one of
// the host names its routes match (the site addresses of a Caddyfile;
// wildcards such as *.example.com included), or the IP address the
// connection was accepted on (a caller that dialled 127.0.0.1:8080 and
// says so), and in both cases the port the connection was accepted on
// (the scheme's default when the Host has none). Host matchers ignore the
// port, so without that check `Host: api.example.com:1` sent completions
// to another port of the host. A catch-all site (":8080") has no host
// names, so only the address passes there; any other Host is the caller's
// free choice.
func knownHost(r *http.Request) bool {
	if r.Host == "" || !isLocalPort(r) {
		return false
	}
	srv, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	// MatchHost needs the request's replacer, which Caddy always sets.
	if _, hasRepl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok && hasRepl {
		for _, route := range srv.Routes {
			for _, set := range route.MatcherSets {
				for _, m := range set {
					var hosts caddyhttp.MatchHost
					switch v := m.(type) {
					case caddyhttp.MatchHost:
						hosts = v
					case *caddyhttp.MatchHost:
						hosts = *v
					default:
						continue
					}
					if hosts.Match(r) {
						return true
					}
				}
			}
		}
	}
	return isLocalAddress(r)
}

// isLocalAddress reports whether the Host is the literal IP address and
// port the connection was accepted on.
func isLocalAddress(r *http.Request) bool {
	lhost, _, ok := localHostPort(r)
	if !ok {
		return false
	}
	host, _ := hostPort(r)
	ip, lip := net.ParseIP(host), net.ParseIP(lhost)
	return ip != nil && lip != nil && ip.Equal(lip) && isLocalPort(r)
}

// isLocalPort reports whether the Host's port (the scheme's default when
// it has none) is the port the connection was accepted on.
func isLocalPort(r *http.Request) bool {
	_, lport, ok := localHostPort(r)
	if !ok {
		return false
	}
	_, port := hostPort(r)
	return port == lport
}

// localHostPort is the address the request's connection was accepted on.
func localHostPort(r *http.Request) (host, port string, ok bool) {
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return "", "", false
	}
	host, port, err := net.SplitHostPort(local.String())
	return host, port, err == nil
}

// hostPort splits the request's Host, with the scheme's default port when
// it names none.
func hostPort(r *http.Request) (host, port string) {
	host, port, err := net.SplitHostPort(r.Host)
	if err != nil {
		host, port = strings.Trim(r.Host, "[]"), "80"
		if r.TLS != nil {
			port = "443"
		}
	}
	return host, port
}

// envelope is the body forwarded to the backend of an async endpoint:
//
//	{"request_id":…,"payload":…,"progress_url":…,"callback_url":…}
//
// Strings are escaped as JavaScript's JSON.stringify escapes them, the
// escaping of the signed canonical string. It is built in one buffer, in
// two steps around the signature: start escapes the request id and the
// payload once and cuts the canonical string to sign from those bytes
// (signing.AsyncCanonical's bytes, without escaping the payload twice);
// finish appends the URLs with the signed query written straight into
// them.
type envelope struct{ b []byte }

// start begins the envelope and returns the canonical string to sign.
func (e *envelope) start(id, payload string, urls jobURLs) []byte {
	const (
		headID = `{"request_id":`
		headP  = `,"payload":`
		canonP = `{"payload":`
		canonI = `,"request_id":`
	)
	// An eighth of slack covers the escapes of typical payloads; the
	// signed query is a base64 signature, escaped, and a timestamp.
	n := len(headID) + len(id) + len(headP) + len(payload) + len(payload)/8 +
		len(urls.progress) + len(urls.callback) + 2*128 + 64
	b := make([]byte, 0, n)
	b = append(b, headID...)
	i0 := len(b)
	b = signing.AppendJSString(b, id)
	i1 := len(b)
	b = append(b, headP...)
	p0 := len(b)
	b = signing.AppendJSString(b, payload)
	p1 := len(b)
	e.b = b
	canon := make([]byte, 0, len(canonP)+(p1-p0)+len(canonI)+(i1-i0)+1)
	canon = append(canon, canonP...)
	canon = append(canon, b[p0:p1]...)
	canon = append(canon, canonI...)
	canon = append(canon, b[i0:i1]...)
	return append(canon, '}')
}

// finish appends the progress and callback URLs, each with the signed
// query, and returns the whole envelope.
func (e *envelope) finish(urls jobURLs, sig, ts string) []byte {
	b := append(e.b, `,"progress_url":`...)
	b = appendSignedURL(b, urls.progress, sig, ts)
	b = append(b, `,"callback_url":`...)
	b = appendSignedURL(b, urls.callback, sig, ts)
	e.b = nil
	return append(b, '}')
}

// appendSignedURL appends u with the signed query as a JSON string. The
// query needs no escaping there: query escaping leaves only letters,
// digits, "-_.~%+", and the "?=&" between its parts.
func appendSignedURL(b []byte, u, sig, ts string) []byte {
	b = signing.AppendJSString(b, u)
	b = appendSignedQuery(b[:len(b)-1], sig, ts)
	return append(b, '"')
}

// accepted is the caller's answer to an async invoke.
type accepted struct {
	Status      string `json:"status"`
	RequestID   string `json:"requestId"`
	ProgressURL string `json:"progressUrl"`
	CallbackURL string `json:"callbackUrl"`
}

func (h *Handler) accept(w http.ResponseWriter, c *call, urls jobURLs) {
	body := acceptedBody(c.requestID, urls)
	hdr := w.Header()
	c.allowance.write(hdr)
	// The four values in one backing array, under their canonical names
	// (what Header.Set would store, one slice each).
	vals := [4]string{"application/json", "no-store", urls.status, strconv.Itoa(len(body))}
	hdr["Content-Type"] = vals[0:1:1]
	hdr["Cache-Control"] = vals[1:2:2]
	hdr["Location"] = vals[2:3:3]
	hdr["Content-Length"] = vals[3:4:4]
	w.WriteHeader(http.StatusAccepted)
	w.Write(body)
	h.rt.CountInvoke(c.svc.ID, c.ep.ID, "async", "ok")
}

// appendSignedQuery appends the query of the progress and callback URLs:
// what "?" + url.Values{"signature": {sig}, "timestamp": {ts}}.Encode()
// writes (keys in order), without its map and sort.
func appendSignedQuery(b []byte, sig, ts string) []byte {
	b = append(b, "?signature="...)
	b = appendQueryEscape(b, sig)
	b = append(b, "&timestamp="...)
	return appendQueryEscape(b, ts)
}

// appendQueryEscape appends url.QueryEscape(s) without its allocation.
func appendQueryEscape(b []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_', c == '.', c == '~':
			b = append(b, c)
		case c == ' ':
			b = append(b, '+')
		default:
			b = append(b, '%', hex[c>>4], hex[c&15])
		}
	}
	return b
}

// acceptedBody is json.Marshal(accepted{"ACCEPTED", id, status URL,
// callback URL}), written without reflection when no string holds a
// character encoding/json escapes (it escapes <, > and & too); otherwise
// by json.Marshal.
func acceptedBody(id string, urls jobURLs) []byte {
	plain := func(s string) bool {
		for i := 0; i < len(s); i++ {
			if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
				return false
			}
		}
		return true
	}
	if !plain(id) || !plain(urls.status) || !plain(urls.callback) {
		body, _ := json.Marshal(accepted{Status: "ACCEPTED", RequestID: id, ProgressURL: urls.status, CallbackURL: urls.callback})
		return body
	}
	b := make([]byte, 0, 80+len(id)+len(urls.status)+len(urls.callback))
	b = append(b, `{"status":"ACCEPTED","requestId":"`...)
	b = append(b, id...)
	b = append(b, `","progressUrl":"`...)
	b = append(b, urls.status...)
	b = append(b, `","callbackUrl":"`...)
	b = append(b, urls.callback...)
	return append(b, `"}`...)
}

// maxBackendAnswer is how much of a backend's answer to an async forward
// is read before the gateway stops listening: the answer is discarded, and
// an acknowledgement is short.
const maxBackendAnswer = 64 << 10

// errAnswerTooLong stops reading a backend's answer to an async forward
// past maxBackendAnswer; the job stands on the status already read.
var errAnswerTooLong = errors.New("backend answer to an async forward is longer than expected")

// backendAnswer stands in for the caller's ResponseWriter while the
// reverse proxy forwards an async job: it keeps the backend's status and
// discards its headers and body.
type backendAnswer struct {
	header http.Header
	r      *http.Request // the forwarded request
	status int
	read   int
	// callerGone: the caller's request was cancelled before the
	// backend's status line (the reverse proxy's 499).
	callerGone bool
}

func (b *backendAnswer) Header() http.Header { return b.header }

func (b *backendAnswer) WriteHeader(status int) {
	if b.status != 0 || b.callerGone || status < 200 { // 1xx are interim
		return
	}
	if callerHungUp(status, b.r) {
		// The backend never accepted the job: invokeAsync fails it.
		b.callerGone = true
		return
	}
	b.status = status
}

func (b *backendAnswer) Write(p []byte) (int, error) {
	if b.callerGone {
		return len(p), nil
	}
	if b.status == 0 {
		b.status = http.StatusOK
	}
	b.read += len(p)
	if b.read > maxBackendAnswer {
		return 0, errAnswerTooLong
	}
	return len(p), nil
}

// errAborted stands for the reverse proxy aborting a response it had
// started (it panics with http.ErrAbortHandler, as net/http's proxy does).
var errAborted = errors.New("backend response aborted")

// serveCaptured runs the proxy into w. An abort after the status line only
// cuts the discarded body short, so it is turned into an error here rather
// than tearing down the caller's connection.
func serveCaptured(next caddyhttp.Handler, w http.ResponseWriter, r *http.Request) (err error) {
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				panic(v)
			}
			err = errAborted
		}
	}()
	return next.ServeHTTP(w, r)
}
