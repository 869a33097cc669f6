package engine

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/servicekey"
	"github.com/platformgw/gateway/internal/store"
)

// AuthenticateKey resolves the Bearer service key of a request. Both
// handlers use it (invoke, job status and result), so a key is refused the
// same way everywhere. Malformed keys are refused before any store lookup,
// by format and checksum.
func (rt *Runtime) AuthenticateKey(r *http.Request) (store.KeyRecord, *apierror.Error) {
	auth := r.Header.Get("Authorization")
	if auth == "" {
		return store.KeyRecord{}, apierror.New(apierror.MissingKey, "send the service key as Authorization: Bearer <key>")
	}
	scheme, token, _ := strings.Cut(auth, " ")
	token = strings.TrimSpace(token)
	if !strings.EqualFold(scheme, "Bearer") || token == "" {
		return store.KeyRecord{}, apierror.New(apierror.MissingKey, "send the service key as Authorization: Bearer <key>")
	}
	return rt.AuthenticateServiceKey(r.Context(), token)
}

// AuthenticateServiceKey resolves a service key given as text: the Bearer
// token of a call, or the serviceKey a backend asks the core routes to
// validate. A key that exists but is revoked or expired is returned with
// the error, so callers can tell whose it was.
func (rt *Runtime) AuthenticateServiceKey(ctx context.Context, token string) (store.KeyRecord, *apierror.Error) {
	if !servicekey.WellFormed(token) {
		return store.KeyRecord{}, apierror.New(apierror.InvalidKey, "the service key is not valid")
	}
	key, err := rt.Keys().KeyByHash(ctx, servicekey.Hash(token))
	if err != nil {
		if errors.Is(err, store.ErrUnavailable) {
			// A shared store (PostgreSQL) that cannot be reached: 503,
			// retry, not an internal error.
			return key, apierror.Unavailable()
		}
		if !errors.Is(err, store.ErrNotFound) {
			rt.Logger.Error("key lookup", zap.Error(err))
			return key, apierror.New(apierror.InternalError, "key lookup failed")
		}
		return key, apierror.New(apierror.InvalidKey, "the service key is not valid")
	}
	t := rt.Now()
	switch key.Status(t) {
	case servicekey.Revoked:
		return key, apierror.New(apierror.KeyRevoked, "the service key was revoked")
	case servicekey.Expired:
		return key, apierror.New(apierror.KeyExpired, "the service key expired")
	}
	if rt.KeyUsed != nil {
		rt.KeyUsed(key.ID, t)
	}
	return key, nil
}
