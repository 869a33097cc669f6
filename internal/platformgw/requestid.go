package platformgw

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	mrand "math/rand/v2"
	"net/http"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// newRequestID returns a random (version 4) UUID in its usual text form,
// as uuid.NewString does, with the string as its only allocation
// (uuid.NewString makes two: the UUID read through an io.Reader, then
// the string). crypto/rand.Read does not let its buffer escape.
func newRequestID() string {
	var u [16]byte
	rand.Read(u[:]) // never fails (crypto/rand crashes the program instead)
	return uuidString(&u)
}

// newFastRequestID is newRequestID from a ChaCha8 generator rather than a
// crypto/rand read per call: math/rand/v2's ChaCha8 is a cryptographically
// strong generator, and each is seeded with 32 bytes of crypto/rand, so
// the ids are as unique and as unguessable as crypto/rand's (122 random
// bits), in ~300 instructions where a crypto/rand read of 16 bytes took
// ~1,300 (callgrind; Linux's vDSO getrandom, a system call before 6.11). The
// generators are kept one per P by a pool (a generator is not safe for
// concurrent use; one the pool drops is replaced by a freshly seeded one).
func newFastRequestID() string {
	g := idGenerators.Get().(*mrand.ChaCha8)
	var u [16]byte
	binary.LittleEndian.PutUint64(u[:8], g.Uint64())
	binary.LittleEndian.PutUint64(u[8:], g.Uint64())
	idGenerators.Put(g)
	return uuidString(&u)
}

var idGenerators = sync.Pool{New: func() any {
	var seed [32]byte
	rand.Read(seed[:])
	return mrand.NewChaCha8(seed)
}}

// uuidString sets u's version (4) and variant (RFC 4122) and returns its
// text form, with the string as the only allocation.
func uuidString(u *[16]byte) string {
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 4122 variant
	var s [36]byte
	hex.Encode(s[0:8], u[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], u[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], u[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], u[8:10])
	s[23] = '-'
	hex.Encode(s[24:], u[10:])
	return string(s[:])
}

// requestID is the id of this HTTP request in the gateway's answers and
// log lines: Caddy's own request UUID, the {http.request.uuid}
// placeholder, which Caddy makes on first use and keeps for the request.
// Reading it also adds it to the request's access log entry (as "uuid"),
// so the X-<Brand>-Request-ID header, the gateway's log lines and the
// access log line carry the same id. Outside a Caddy server (no replacer
// or no access log fields in the context; the placeholder needs both) a
// fresh UUID.
func requestID(r *http.Request) string {
	ctx := r.Context()
	repl, ok := ctx.Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if _, extra := ctx.Value(caddyhttp.ExtraLogFieldsCtxKey).(*caddyhttp.ExtraLogFields); ok && extra {
		if v, _ := repl.Get(caddyUUIDPlaceholder); v != nil {
			if id, _ := v.(string); id != "" {
				return id
			}
		}
	}
	return newRequestID()
}

// invokeRequestID is requestID for an invoke, sync or async (an async
// call's id is its job's id): Caddy's {http.request.uuid} when something
// read it already, else a UUID of newFastRequestID's that it makes that
// placeholder's value, as Caddy would have (the replacer's own values are
// read before its HTTP placeholders, so every later {http.request.uuid}
// is this one) and puts in the access log entry as "uuid". Caddy makes
// its UUID with a crypto/rand read per request, a system call on the path
// of every call. A job's id is as unguessable either way (122 bits from a
// generator seeded by crypto/rand), and the store still checks it is new.
func invokeRequestID(r *http.Request) string {
	ctx := r.Context()
	repl, ok := ctx.Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	extra, ok2 := ctx.Value(caddyhttp.ExtraLogFieldsCtxKey).(*caddyhttp.ExtraLogFields)
	if !ok || !ok2 {
		return newFastRequestID()
	}
	if caddyhttp.GetVar(ctx, caddyUUIDVar) != nil {
		return requestID(r) // made already: the access log has it
	}
	id := newFastRequestID()
	repl.Set(caddyUUIDPlaceholder, id)
	extra.Set(zap.String("uuid", id))
	return id
}

// caddyUUIDPlaceholder is Caddy's request id placeholder; caddyUUIDVar the
// request variable Caddy keeps the UUID it made for it in.
const (
	caddyUUIDPlaceholder = "http.request.uuid"
	caddyUUIDVar         = "uuid"
)

// The placeholders a checked call publishes (docs/configuration.md,
// "Placeholders"). http.auth.user.id is the one caddyauth sets; the
// others are the gateway's own, under http.platform. Never a key, a
// hash or a signature.
const (
	phUserID     = "http.auth.user.id"
	phKeyID      = "http.platform.key_id"
	phServiceID  = "http.platform.service_id"
	phEndpointID = "http.platform.endpoint_id"
	phProductID  = "http.platform.product_id"
)

// publish makes the call's caller and route known as placeholders once its
// key is checked, for the access log (log_append) and for handlers after
// platform_gateway. It adds one provider that reads the call, rather than
// setting each value: nothing is converted until a placeholder is read.
func (c *call) publish(r *http.Request) {
	if c.key.ID == "" {
		return // the key was not accepted: nothing to tell
	}
	if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		repl.Map(c.placeholder)
	}
}

// placeholder answers the placeholders publish adds; one the call did not
// get as far as (an unknown service, a service owner's call without a
// product) is unknown.
func (c *call) placeholder(key string) (any, bool) {
	var v string
	switch key {
	case phUserID:
		v = c.key.UserID
	case phKeyID:
		v = c.key.ID
	case phServiceID:
		if c.svc != nil {
			v = c.svc.ID
		}
	case phEndpointID:
		if c.ep != nil {
			v = c.ep.ID
		}
	case phProductID:
		if c.product != nil {
			v = c.product.ID
		}
	default:
		return nil, false
	}
	if v == "" {
		return nil, false
	}
	return v, true
}
