package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/platformgw/gateway/internal/billing"
)

// TestLargeCallNeverLocksCallerOut: one call stating 60 units raises what
// the caller's next calls hold (docs/wire-contract.md, "Claims past a
// hard limit"). With 40 of 100 units (or credits) left, every one-unit
// call after it was refused up front (429 quota_exceeded with a
// Retry-After of the whole period, 403 insufficient_credits "this call
// costs 60"), and as a refused call never lowered the estimate, the
// caller had lost the rest of its quota or credits until a restart. A
// call whose estimate does not fit now holds what is left when that
// covers its cost, and the estimate falls with the calls served.
func TestLargeCallNeverLocksCallerOut(t *testing.T) {
	be := newTestBackend(t, testSecret, "Platform")
	g := startGateway(t, t.TempDir(), fmt.Sprintf(`
		service lock {
			backend %s
			secret %s
			endpoint units {
				path /units
			}
			endpoint free {
				path /units
				cost 0
			}
			product tokens {
				billing SUBSCRIPTION
				measurement PER_TOKEN
				unit token
				quota 100
				overage block
			}
			product prepaid {
				billing PREPAID
				measurement PER_TOKEN
				unit token
				price 1
			}
		}`, be.URL, testSecret))
	for _, p := range []string{"tokens", "prepaid"} {
		t.Run(p, func(t *testing.T) {
			user := "lock-" + p
			g.subscribe(user, "lock", p, "ACTIVE")
			if p == "prepaid" {
				g.credits(user, "lock", "100")
			}
			key, _ := g.newKey(user)
			if resp, body := call(t, "POST", invokeURL("lock", "units")+"?n=60", key, "x"); resp.StatusCode != http.StatusOK {
				t.Fatalf("the large call: %d %s", resp.StatusCode, body)
			}
			for i := range 20 {
				if resp, body := call(t, "POST", invokeURL("lock", "units")+"?n=1", key, "x"); resp.StatusCode != http.StatusOK {
					t.Fatalf("one-unit call %d with 40 units left: %d %s", i+1, resp.StatusCode, body)
				}
			}
			st := raceState(t, g, user, "lock")
			if got := ledgerSum(g.ledger(user)); got != billing.Whole(80) || st.Reserved != 0 || st.CreditsHeld != 0 {
				t.Fatalf("charged %s (state %+v), want 80 units and nothing held", got, st)
			}
			// The limit still holds: 20 left, a call stating 30 is served
			// and cut at the limit (claims past it are not charged), and
			// then nothing is left for another call.
			call(t, "POST", invokeURL("lock", "units")+"?n=30", key, "x")
			resp, body := call(t, "POST", invokeURL("lock", "units")+"?n=1", key, "x")
			if resp.StatusCode == http.StatusOK {
				t.Fatalf("a call past the limit was served: %s", body)
			}
			// The refusal names what a call costs, not the estimate.
			if p == "prepaid" && !strings.Contains(string(body), "this call costs 1 ") {
				t.Errorf("refusal past the limit: %d %s", resp.StatusCode, body)
			}
			if got := ledgerSum(g.ledger(user)); got != billing.Whole(100) {
				t.Fatalf("charged %s, want the 100 units of the limit", got)
			}
		})
	}
	// An endpoint of cost 0 holds nothing of its own: with nothing left,
	// "what is left covers the cost" held for every call, and each was
	// served free past the limit.
	t.Run("cost 0", func(t *testing.T) {
		g.subscribe("lock-free", "lock", "tokens", "ACTIVE")
		key, _ := g.newKey("lock-free")
		served := 0
		for range 10 {
			if resp, _ := call(t, "POST", invokeURL("lock", "free")+"?n=60", key, "x"); resp.StatusCode == http.StatusOK {
				served++
			}
		}
		if got := ledgerSum(g.ledger("lock-free")); served > 2 || got != billing.Whole(100) {
			t.Fatalf("%d of 10 calls stating 60 served on a quota of 100, %s charged; want 2 served (the second cut at the limit), 100 charged", served, got)
		}
	})
}

// meterEdgesBackend answers per ?mode=: units in a trailer (announced,
// announced on a stream, unannounced), a large plain body, a redirect and
// a 304.
func meterEdgesBackend(t *testing.T) *httptest.Server {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch r.URL.Query().Get("mode") {
		case "trailer":
			w.Header().Set("Trailer", "X-Platform-Units")
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: tok\n\n")
			w.(http.Flusher).Flush()
			w.Header().Set("X-Platform-Units", "50")
		case "trailer-plain":
			w.Header().Set("Trailer", "X-Platform-Units")
			io.WriteString(w, "plain")
			w.Header().Set("X-Platform-Units", "50")
		case "trailer-late":
			io.WriteString(w, "data: tok\n\n")
			w.(http.Flusher).Flush()
			w.Header().Set(http.TrailerPrefix+"X-Platform-Units", "50")
		case "big":
			w.Header().Set("Content-Type", "text/plain")
			w.Write(bytes.Repeat([]byte("b"), 100_000))
		case "redirect":
			w.Header().Set("Location", "/elsewhere")
			w.WriteHeader(http.StatusFound)
			io.WriteString(w, "moved")
		case "304":
			w.Header().Set("ETag", `"v1"`)
			w.WriteHeader(http.StatusNotModified)
		default:
			io.WriteString(w, "ok")
		}
	}))
	t.Cleanup(be.Close)
	return be
}

func meterEdgesCatalog(backend string) string {
	return fmt.Sprintf(`
		service rv {
			backend %[1]s
			secret %[2]s
			endpoint tok {
				path /tok
				streaming
			}
			product token {
				billing USAGE_POSTPAID
				measurement PER_TOKEN
				unit token
				price 0.001
			}
		}
		service rvbytes {
			backend %[1]s
			secret %[2]s
			endpoint big {
				path /big
			}
			product bytes {
				billing USAGE_POSTPAID
				measurement PER_BYTE
				unit byte
				price 0.000001
			}
		}
		service rvwrap {
			backend %[1]s
			secret %[2]s
			sync_response wrapped
			endpoint go {
				path /go
			}
			product prepaid {
				billing PREPAID
				measurement PER_REQUEST
				unit request
				price 2
			}
		}`, backend, testSecret)
}

// TestUnitsTrailerNeverReachesCaller: units a backend states in a
// trailer are not read (the call counts its cost, docs/wire-contract.md)
// and, like the X-Platform-Units header, never reach the caller: the
// proxy passed them on as a trailer, and a wrapped answer turned an
// announced one into a header of its own.
func TestUnitsTrailerNeverReachesCaller(t *testing.T) {
	be := meterEdgesBackend(t)
	g := startGateway(t, t.TempDir(), meterEdgesCatalog(be.URL))
	for _, tc := range []struct{ svc, ep, prod, mode string }{
		{"rv", "tok", "token", "trailer"}, {"rv", "tok", "token", "trailer-late"}, {"rv", "tok", "token", "trailer-plain"},
		{"rvwrap", "go", "prepaid", "trailer-plain"}, {"rvwrap", "go", "prepaid", "trailer-late"},
	} {
		t.Run(tc.svc+" "+tc.mode, func(t *testing.T) {
			user := "tr-" + tc.svc + "-" + tc.mode
			g.subscribe(user, tc.svc, tc.prod, "ACTIVE")
			g.credits(user, tc.svc, "10")
			key, _ := g.newKey(user)
			req, _ := http.NewRequest("POST", invokeURL(tc.svc, tc.ep)+"?mode="+tc.mode, strings.NewReader("x"))
			req.Header.Set("Authorization", "Bearer "+key)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			if v := resp.Header.Get("X-Platform-Units"); v != "" {
				t.Errorf("the caller sees an X-Platform-Units header %q", v)
			}
			if v := resp.Trailer.Get("X-Platform-Units"); v != "" {
				t.Errorf("the caller sees an X-Platform-Units trailer %q", v)
			}
			if es := g.ledger(user); len(es) != 1 || es[0].Units != billing.Whole(1) {
				t.Errorf("ledger %+v, want the call's cost, 1", es)
			}
		})
	}
}

// TestPerByteBehindEncode: with Caddy's encode in front of the gateway
// (its default order puts encode first), a PER_BYTE answer was compressed
// after it was counted: 627 gzip bytes delivered, 100,000 charged. The
// gateway now asks encode not to transform a PER_BYTE body it counts, so
// what is charged is what is delivered.
func TestPerByteBehindEncode(t *testing.T) {
	be := meterEdgesBackend(t)
	dir := t.TempDir()
	cfg := fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	https_port 9443
	platform {
		store %s/platform.db
%s
	}
}
:%d {
	bind 127.0.0.1
	encode gzip
	platform_usage
	platform_gateway
	reverse_proxy {
		dynamic platform
		transport platform
	}
}
`, adminPort, gwPort, dir, meterEdgesCatalog(be.URL), gwPort)
	tester := testerFor(t, filepath.Join(dir, "platform.db"))
	tester.InitServer(cfg, "caddyfile")
	g := &gateway{t: t, tester: tester, dir: dir}
	g.subscribe("enc", "rvbytes", "bytes", "ACTIVE")
	key, _ := g.newKey("enc")
	tr := &http.Transport{DisableCompression: true}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest("POST", invokeURL("rvbytes", "big")+"?mode=big", strings.NewReader("x"))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	charged := ledgerSum(g.ledger("enc"))
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "" || charged != billing.Whole(int64(len(body))) || len(body) != 100_000 {
		t.Fatalf("%d, Content-Encoding %q: %d body bytes delivered, %s charged; want 100000 of each",
			resp.StatusCode, resp.Header.Get("Content-Encoding"), len(body), charged)
	}
}

// TestWrapped3xxNotCharged: a wrapped endpoint answers a backend's 3xx
// (a redirect, a 304 to a conditional request) with 502 service_error,
// an error instead of the answer, which was charged all the same.
func TestWrapped3xxNotCharged(t *testing.T) {
	be := meterEdgesBackend(t)
	g := startGateway(t, t.TempDir(), meterEdgesCatalog(be.URL))
	for _, mode := range []string{"redirect", "304"} {
		t.Run(mode, func(t *testing.T) {
			user := "wr-" + mode
			g.subscribe(user, "rvwrap", "prepaid", "ACTIVE")
			g.credits(user, "rvwrap", "10")
			key, _ := g.newKey(user)
			req, _ := http.NewRequest("POST", invokeURL("rvwrap", "go")+"?mode="+mode, strings.NewReader("x"))
			req.Header.Set("Authorization", "Bearer "+key)
			req.Header.Set("If-None-Match", `"v1"`)
			resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			st := raceState(t, g, user, "rvwrap")
			if resp.StatusCode != http.StatusBadGateway || errorCode(t, resp, body) != "service_error" {
				t.Fatalf("a wrapped %s: %d %s, want 502 service_error", mode, resp.StatusCode, body)
			}
			if es := g.ledger(user); len(es) != 0 || st.Credits != billing.Whole(10) || st.CreditsHeld != 0 {
				t.Fatalf("a wrapped %s answered 502: ledger %+v, credits %s (held %s), want nothing charged", mode, es, st.Credits, st.CreditsHeld)
			}
		})
	}
}
