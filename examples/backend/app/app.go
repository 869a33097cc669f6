// Package app is the example sync backend behind the gateway: the HTTP
// handler of examples/backend, kept apart from its main so tests can run it
// against the real gateway. Every request goes through the SDK's
// Verifier.Middleware, so a handler only ever sees calls that came,
// unchanged and recently, from the gateway, and reads the caller from
// sdk.FromContext.
//
//	GET|POST /hello     echo of the trusted caller context
//	POST     /complete  pretends to generate text, one token per word of the
//	                    prompt; to a PER_TOKEN subscriber it states the tokens
//	                    in X-<Brand>-Units, so the call is charged what it
//	                    used (other products pay the endpoint's cost)
package app

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"

	"github.com/platformgw/gateway/sdk"
)

// New returns the backend's handler. v checks the gateway's signature; its
// Brand is also the brand of the units header.
func New(v *sdk.Verifier) http.Handler {
	b := &backend{brand: v.Brand}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", b.hello)
	mux.HandleFunc("POST /hello", b.hello)
	mux.HandleFunc("POST /complete", b.complete)
	return v.Middleware(mux)
}

type backend struct {
	brand string
}

// Caller is the trusted context the gateway signed, as the backend echoes
// it.
type Caller struct {
	UserID             string   `json:"userId"`
	ServiceProductID   string   `json:"serviceProductId"`
	Roles              []string `json:"roles"`
	SubscriptionStatus string   `json:"subscriptionStatus"`
	BillingModel       string   `json:"billingModel,omitempty"`
	MeasurementType    string   `json:"measurementType,omitempty"`
	UnitLabel          string   `json:"unitLabel,omitempty"`
	RequestID          string   `json:"requestId"`
	Subscriber         bool     `json:"subscriber"`
}

// Hello is the answer of /hello.
type Hello struct {
	Message string `json:"message"`
	Method  string `json:"method"`
	Query   string `json:"query"`
	Body    string `json:"body"`
	Caller  Caller `json:"caller"`
}

// Completion is the answer of /complete.
type Completion struct {
	Completion string `json:"completion"`
	Tokens     int    `json:"tokens"`
	Caller     Caller `json:"caller"`
}

// caller returns the verified caller of a sync call. An async envelope
// sent to these endpoints is refused: they answer in the response, and a
// 2xx would leave the job waiting for a completion that never comes.
func caller(w http.ResponseWriter, r *http.Request) (*sdk.CallerContext, bool) {
	cc, _ := sdk.FromContext(r.Context()) // always there behind the middleware
	if cc.Job != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "this endpoint answers synchronously; call it with /invoke")
		return nil, false
	}
	return cc, true
}

func (b *backend) hello(w http.ResponseWriter, r *http.Request) {
	cc, ok := caller(w, r)
	if !ok {
		return
	}
	body, _ := io.ReadAll(r.Body) // the middleware already read it into memory
	writeJSON(w, http.StatusOK, Hello{
		Message: "hello from the example backend",
		Method:  r.Method,
		Query:   r.URL.RawQuery,
		Body:    string(body),
		Caller:  echo(cc),
	})
}

// complete "generates" the prompt in upper case, one token per word. For a
// product measured in tokens it states them before writing the status: the
// gateway reads and removes the header and meters those units. A stated
// count replaces the endpoint's cost whatever the product, so it is left
// out for products that count requests.
func (b *backend) complete(w http.ResponseWriter, r *http.Request) {
	cc, ok := caller(w, r)
	if !ok {
		return
	}
	body, _ := io.ReadAll(r.Body)
	prompt := string(body)
	tokens := len(strings.Fields(prompt))
	if cc.MeasurementType == "PER_TOKEN" {
		sdk.SetUnits(w.Header(), b.brand, sdk.WholeUnits(int64(tokens)))
	}
	writeJSON(w, http.StatusOK, Completion{Completion: strings.ToUpper(prompt), Tokens: tokens, Caller: echo(cc)})
}

func echo(cc *sdk.CallerContext) Caller {
	roles := cc.Roles
	if roles == nil {
		roles = []string{}
	}
	return Caller{
		UserID:             cc.UserID,
		ServiceProductID:   cc.ServiceProductID,
		Roles:              roles,
		SubscriptionStatus: cc.SubscriptionStatus,
		BillingModel:       cc.BillingModel,
		MeasurementType:    cc.MeasurementType,
		UnitLabel:          cc.UnitLabel,
		RequestID:          cc.RequestID,
		Subscriber:         cc.IsSubscriber(),
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// writeError answers in the JSON error shape of the wire contract, as the
// SDK's middleware does for a refused signature.
func writeError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, map[string]string{"code": code, "message": message})
}
