package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
)

// TestTimeChargedFromForwarding: a PER_TIME_UNIT call is charged the
// seconds from its forwarding to the end of its stream. The clock started
// when the gateway had the request's headers, so a caller whose body took
// 2.5 s to arrive (a slow uplink) was charged 3 seconds for a backend that
// answered at once, though the backend sees nothing of a body before the
// gateway has read all of it.
func TestTimeChargedFromForwarding(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: done\n\n")
	}))
	t.Cleanup(be.Close)
	g := startGateway(t, t.TempDir(), fmt.Sprintf(`
		service timed {
			backend %s
			secret %s
			endpoint stream {
				streaming
			}
			product second {
				billing USAGE_POSTPAID
				measurement PER_TIME_UNIT
				unit second
				price 0.01
			}
		}`, be.URL, testSecret))
	g.subscribe("slow-uplink", "timed", "second", "ACTIVE")
	key, _ := g.newKey("slow-uplink")
	pr, pw := io.Pipe()
	go func() {
		for range 5 {
			pw.Write([]byte("x"))
			time.Sleep(500 * time.Millisecond)
		}
		pw.Close()
	}()
	req, _ := http.NewRequest("POST", invokeURL("timed", "stream"), pr)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	waitFor(t, "the call's ledger row", func() bool { return len(g.ledger("slow-uplink")) > 0 })
	es := g.ledger("slow-uplink")
	if resp.StatusCode != http.StatusOK || len(es) != 1 || es[0].Units != billing.Whole(1) {
		t.Fatalf("status %d, ledger %+v; want one row of 1 second", resp.StatusCode, es)
	}
}
