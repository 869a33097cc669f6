package usagehandler

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/signing"
)

// signedRequest is a backend's request to the usage service: the exact body
// bytes received and the signature headers, not yet verified.
type signedRequest struct {
	body      []byte
	signature string
	timestamp string
	// repeated: a signature or timestamp header came more than once.
	// Only the first was checked, so what a proxy or log in between read
	// (another line, or the lines joined) could differ from what was
	// verified; such a request is refused as not signed.
	repeated bool
}

// readSigned reads the body (refusing one over usage_max_body_bytes with
// 413) and the signature headers. Nothing is verified or parsed yet.
func (h *Handler) readSigned(r *http.Request) (signedRequest, *apierror.Error) {
	limit := h.rt.Limits.UsageMaxBodyBytes
	tooLarge := apierror.New(apierror.PayloadTooLarge, "request body is larger than the limit")
	if r.ContentLength > limit {
		return signedRequest{}, tooLarge
	}
	var buf bytes.Buffer
	if r.Body != nil {
		n, err := buf.ReadFrom(io.LimitReader(r.Body, limit+1))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return signedRequest{}, tooLarge
			}
			return signedRequest{}, apierror.Invalid("body", "could not read the request body")
		}
		if n > limit {
			return signedRequest{}, tooLarge
		}
	}
	hd := h.rt.Headers
	return signedRequest{
		body:      buf.Bytes(),
		signature: r.Header.Get(hd.Signature),
		timestamp: r.Header.Get(hd.Timestamp),
		repeated:  len(r.Header.Values(hd.Signature)) > 1 || len(r.Header.Values(hd.Timestamp)) > 1,
	}, nil
}

// signedBy reports whether one of the service's secrets made the signature
// over the raw body followed by the timestamp header, as received.
func (s signedRequest) signedBy(svc *catalog.Service) bool {
	return s.signature != "" && !s.repeated && signing.Verify(svc.VerifySecrets(), s.signature, s.body, []byte(s.timestamp))
}

// verify checks a request signed by svc: the signature first (so a forger
// learns nothing from the timestamp answer), then that the timestamp lies
// in [from, to] widened by the skew allowance.
func (h *Handler) verify(s signedRequest, svc *catalog.Service, from, to time.Time, route string) *apierror.Error {
	if e := h.unsigned(s); e != nil {
		h.rt.CountSignatureFailure(route)
		return e
	}
	if !s.signedBy(svc) {
		h.rt.CountSignatureFailure(route)
		return badSignature()
	}
	return h.fresh(s, from, to, route)
}

// unsigned refuses a request that carries no signature to check: none,
// or the signature or timestamp header more than once. nil otherwise.
func (h *Handler) unsigned(s signedRequest) *apierror.Error {
	switch {
	case s.signature == "":
		return h.notSigned()
	case s.repeated:
		return apierror.New(apierror.InvalidSignature, "send "+h.rt.Headers.Signature+" and "+h.rt.Headers.Timestamp+" once each")
	}
	return nil
}

// unknownSigner refuses a request naming a service the catalog does not
// have: no secret of it can have signed. The answer is the one verify
// gives a request its named service did not sign, message and all, so
// that a caller without a secret cannot tell which service ids exist.
func (h *Handler) unknownSigner(s signedRequest, route string) *apierror.Error {
	h.rt.CountSignatureFailure(route)
	if e := h.unsigned(s); e != nil {
		return e
	}
	return badSignature()
}

func (h *Handler) notSigned() *apierror.Error {
	return apierror.New(apierror.InvalidSignature, "the request is not signed: send "+h.rt.Headers.Signature+" and "+h.rt.Headers.Timestamp)
}

func badSignature() *apierror.Error {
	return apierror.New(apierror.InvalidSignature, "the signature does not match the body and timestamp")
}

// fresh checks the timestamp header of a request whose signature holds.
func (h *Handler) fresh(s signedRequest, from, to time.Time, route string) *apierror.Error {
	ts, err := signing.ParseTimestamp(s.timestamp)
	if err != nil {
		h.rt.CountSignatureFailure(route)
		return apierror.New(apierror.StaleTimestamp, h.rt.Headers.Timestamp+" must be Unix epoch seconds")
	}
	if !signing.Within(ts, from, to, time.Duration(h.rt.Limits.TimestampTolerance)) {
		h.rt.CountSignatureFailure(route)
		return apierror.New(apierror.StaleTimestamp, "the timestamp is outside the accepted window")
	}
	return nil
}
