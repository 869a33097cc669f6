package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/platformgw/gateway/billing"
)

// The billing holes an outside attack run found against the built binary,
// each driven here through the real gateway.

const holesSecret = "holes-secret-holes-secret-000001"

func holesCatalog(backend string) string {
	return fmt.Sprintf(`
		service holes {
			backend %s
			secret %s
			endpoint echo {
				path /echo
			}
			product capped {
				billing SUBSCRIPTION
				measurement PER_REQUEST
				unit request
				quota 20
				overage allow
				price 0.5
				spending_cap 15
			}
		}`, backend, holesSecret)
}

// userCalls counts the calls a backend served for user.
func (b *testBackend) userCalls(user string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, s := range b.seen {
		if s.Header.Get("X-Platform-User-ID") == user {
			n++
		}
	}
	return n
}

// TestSpendingCapNeverServesFree: the attack run's product (20 included,
// then 0.5 a call up to a cap of 15: 50 calls in all); 300 callers × 3
// rounds over 30 keys of one user race for what is left of it, from zero
// and from several points of the cap. Exactly the calls the cap allows are
// served, each is charged in full (no ledger row cut below its claim), the
// backend sees no other call, and every other caller gets 429
// quota_exceeded with Retry-After before anything is forwarded.
func TestSpendingCapNeverServesFree(t *testing.T) {
	const callers, rounds, keys = 300, 3, 30
	be := newTestBackend(t, holesSecret, "Platform")
	g := startGateway(t, t.TempDir(), holesCatalog(be.URL))
	url := invokeURL("holes", "echo")
	for _, used := range []int{0, 7, 20, 33, 49} {
		t.Run(fmt.Sprintf("from %d used", used), func(t *testing.T) {
			user := fmt.Sprintf("cap-%d", used)
			g.subscribe(user, "holes", "capped", "ACTIVE")
			var ks []string
			for range keys {
				k, _ := g.newKey(user)
				ks = append(ks, k)
			}
			if used > 0 {
				raceReport(t, holesSecret, user, "holes", fmt.Sprint(used))
			}
			before := ledgerSum(g.ledger(user))
			var mu sync.Mutex
			codes := map[string]int{}
			noRetry := 0
			count, errs := raceAll(callers, func(i int) (int, error) {
				ok := 0
				for range rounds {
					resp, body, err := raceInvokeResp(url, ks[i%keys])
					if err != nil {
						return 0, err
					}
					if resp.StatusCode == 200 {
						ok++
						continue
					}
					var e struct{ Code string }
					json.Unmarshal(body, &e)
					mu.Lock()
					codes[fmt.Sprint(resp.StatusCode, " ", e.Code)]++
					if resp.Header.Get("Retry-After") == "" {
						noRetry++
					}
					mu.Unlock()
				}
				return ok, nil
			})
			if len(errs) > 0 {
				t.Fatalf("%d transport errors, first %v", len(errs), errs[0])
			}
			served := 0
			for ok, n := range count {
				served += ok * n
			}
			want := 50 - used
			if served != want || codes["429 quota_exceeded"] != callers*rounds-want || len(codes) != 1 || noRetry != 0 {
				t.Errorf("%d calls served, refusals %v (%d without Retry-After); want %d served, the rest 429 quota_exceeded",
					served, codes, noRetry, want)
			}
			if got := be.userCalls(user); got != served {
				t.Errorf("the backend served %d calls, the callers got %d", got, served)
			}
			var claimedFree []string
			for _, e := range g.ledger(user) {
				if e.UnitsClaimed > e.Units {
					claimedFree = append(claimedFree, fmt.Sprintf("%s of %s", e.Units, e.UnitsClaimed))
				}
			}
			if len(claimedFree) > 0 {
				t.Errorf("ledger rows charged below their claim (served free): %s", strings.Join(claimedFree, ", "))
			}
			if got := ledgerSum(g.ledger(user)) - before; got != billing.Whole(int64(served)) {
				t.Errorf("ledger grew by %s for %d calls served", got, served)
			}
			st := raceState(t, g, user, "holes")
			if st.Used != billing.Whole(50) || st.Spend != billing.Whole(15) || st.Reserved != 0 || st.ReservedSpend != 0 {
				t.Errorf("state %+v, want 50 used, spend at the cap 15, nothing held", st)
			}
		})
	}
}

// raceInvokeResp is a sync invoke that may run off the test goroutine and
// keeps the response headers.
func raceInvokeResp(url, key string) (*http.Response, []byte, error) {
	req, err := http.NewRequest("POST", url, strings.NewReader("x"))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}
