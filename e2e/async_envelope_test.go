package e2e

import (
	"testing"
)

// TestAsyncEnvelopeContentTypeKept: the backend of an async endpoint
// always receives Content-Type: application/json with the envelope
// (docs/wire-contract.md, "Async invoke"). A caller's Connection header
// naming Content-Type made the reverse proxy drop it as hop-by-hop, after
// the gateway had set it for the envelope: the backend got the JSON
// envelope without a Content-Type (a JSON body parser in the backend then
// leaves it unread, and the job fails).
func TestAsyncEnvelopeContentTypeKept(t *testing.T) {
	be := newUsageBackend(t, usageSecret)
	g := startGateway(t, t.TempDir(), asyncQuotaCatalog(be.URL))
	key, _ := g.newKey("u-env")
	g.subscribe("u-env", "quota", "ten", "ACTIVE")
	for _, conn := range []string{"Content-Type", "keep-alive, content-type", "Content-Length, Content-Type, Content-Encoding"} {
		resp, body := call(t, "POST", asyncURL("/api", "quota", "job"), key, `{"a":1}`,
			"Content-Type", "text/plain", "Content-Encoding", "identity", "Connection", conn)
		if resp.StatusCode != 202 {
			t.Fatalf("Connection %q: %d %s", conn, resp.StatusCode, body)
		}
		env := be.next(t)
		if got := env.Header.Values("Content-Type"); len(got) != 1 || got[0] != "application/json" {
			t.Errorf("Connection %q: the backend got Content-Type %q with the envelope, want application/json", conn, got)
		}
		if !env.SigOK || env.Payload != `{"a":1}` {
			t.Errorf("Connection %q: envelope %s (signature ok %v)", conn, env.Raw, env.SigOK)
		}
	}
}
