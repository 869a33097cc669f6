package portal

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/store"
)

// Keys beyond the list: when each was last used, the confirmation step
// before a revocation, and the curl lines a caller copies to try a call.

// keyUse is what tells when a key last authenticated a request; *ops.Ops
// has it. The ledger cannot: its rows do not carry the key that paid for
// them. It is kept in memory by each node since it started, so "not
// since the gateway started" is an answer of its own.
type keyUse interface {
	KeyLastUsed(keyID string) (time.Time, bool)
}

// lastUsed is when key id last authenticated a request on this node, if
// it did since the node started.
func (h *Handler) lastUsed(id string) (time.Time, bool) {
	if u, ok := h.ops.(keyUse); ok {
		return u.KeyLastUsed(id)
	}
	return time.Time{}, false
}

// revokeView is the confirmation page before a key is revoked.
type revokeView struct {
	Key     keyRow
	Current bool // the key of this session: revoking it signs out
	// Children are the active keys made under it that go with it
	// (minted_keys follow_parent when they were made).
	Children int
}

// confirmRevoke is the first step of revoking a key (GET
// /keys/revoke?key_id=): a page that names the key and what revoking it
// does, with the form that revokes it. Nothing changes until that form
// is posted.
func (h *Handler) confirmRevoke(q *request) {
	_, sess, sessionKey, ok := h.signedIn(q)
	if !ok {
		return
	}
	if !h.AllowKeyManagement {
		h.message(q, http.StatusForbidden, "Key management is off",
			"The operator of this portal does not let callers create or revoke keys here.")
		return
	}
	id := q.r.URL.Query().Get("key_id")
	target, err := h.rt.Store().KeyByID(q.r.Context(), id)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		h.logger.Error("portal key lookup", zap.String("user_id", sess.UserID), zap.Error(err))
		h.message(q, http.StatusInternalServerError, "Something went wrong", "The key could not be read; try again.")
		return
	}
	// Another user's key is answered like one that does not exist.
	if err != nil || id == "" || target.UserID != sess.UserID {
		h.message(q, http.StatusNotFound, "No such key", "None of your keys has that id.")
		return
	}
	if !target.ActiveAt(q.now) {
		h.message(q, http.StatusConflict, "Key already ended", "That key is already revoked or expired; there is nothing to revoke.")
		return
	}
	v := revokeView{Key: h.keyRow(target, q.now, sessionKey.ID), Current: target.ID == sessionKey.ID}
	keys, err := h.rt.Store().ListKeys(q.r.Context(), sess.UserID)
	if err != nil {
		h.logger.Error("portal key list", zap.String("user_id", sess.UserID), zap.Error(err))
		h.message(q, http.StatusInternalServerError, "Something went wrong", "Your keys could not be read; try again.")
		return
	}
	for _, k := range keys {
		if k.UserID == sess.UserID && k.ParentKeyID == target.ID && k.EndsWithParent && k.ActiveAt(q.now) {
			v.Children++
		}
	}
	h.render(q, http.StatusOK, "revoke", page{Title: "Revoke a key", Base: q.base, CSRF: sess.CSRF, UserID: sess.UserID, Revoke: &v})
}

// keyRow is a key as the pages list it.
func (h *Handler) keyRow(k store.KeyRecord, now time.Time, sessionKeyID string) keyRow {
	r := keyRow{KeyRecord: k, Status: string(k.Status(now)), Current: k.ID == sessionKeyID}
	r.LastUsed, r.Used = h.lastUsed(k.ID)
	return r
}

// curlLine is a call a caller can paste into a shell to try an endpoint.
type curlLine struct {
	ID        string // the element id of its text, for the copy button
	ServiceID string
	Endpoint  string
	Line      string
}

// maxCurlLines bounds the lines shown per service.
const maxCurlLines = 5

// curlLines are the calls to the endpoints of a subscribed service, with
// key standing for the key (a shell variable, never a real key unless it
// is the one just created and shown once).
func curlLines(base string, prefix string, svc *catalog.Service, key string) []curlLine {
	var out []curlLine
	for i, ep := range svc.Endpoints {
		if i == maxCurlLines {
			break
		}
		method := "POST"
		if len(ep.Methods) > 0 && !containsFold(ep.Methods, "POST") {
			method = strings.ToUpper(ep.Methods[0])
		}
		path := prefix + "/service/" + svc.ID + "/endpoint/" + ep.ID + "/invoke"
		if ep.AsyncOnly {
			path += "/async"
		}
		line := "curl -X " + method + " '" + base + path + "' -H \"Authorization: Bearer " + key + "\""
		if method == "POST" || method == "PUT" {
			line += " -H 'Content-Type: application/json' -d '{}'"
		}
		out = append(out, curlLine{ID: "curl-" + svc.ID + "-" + ep.ID, ServiceID: svc.ID, Endpoint: ep.ID, Line: line})
	}
	return out
}

func containsFold(list []string, s string) bool {
	for _, v := range list {
		if strings.EqualFold(v, s) {
			return true
		}
	}
	return false
}

// gatewayBase is the site the gateway answers on: the public URL when
// the operator set one, else this request's own scheme and host.
func (h *Handler) gatewayBase(q *request) (base, prefix string) {
	prefix = "/api"
	if p := h.rt.Prefixes.Gateway; len(p) > 0 {
		prefix = p[0]
	}
	if h.rt.PublicURL != "" {
		return strings.TrimRight(h.rt.PublicURL, "/"), prefix
	}
	scheme := "http"
	if q.r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + q.r.Host, prefix
}
