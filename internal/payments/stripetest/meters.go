package stripetest

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// MeterEvent is a meter event as the recording proxy saw it.
type MeterEvent struct {
	Identifier, EventName, Customer string
	Value, Timestamp                int64
	// Taken: some attempt of it was answered 200.
	Taken bool
	// Attempts counts the requests that carried it.
	Attempts int
}

// MeterEvents returns the meter events the proxy saw, by identifier. An
// identifier sent twice with another customer, meter or value fails the
// test: that is the double count Stripe's deduplication cannot undo.
func (m *Mock) MeterEvents(t testing.TB) map[string]MeterEvent {
	t.Helper()
	out := map[string]MeterEvent{}
	for _, r := range m.Requests("/v1/billing/meter_events") {
		id := r.Form.Get("identifier")
		v, err := strconv.ParseInt(r.Form.Get("payload[value]"), 10, 64)
		if id == "" || err != nil {
			t.Fatalf("a meter event without an identifier or a whole value: %v", r.Form)
		}
		ev := MeterEvent{Identifier: id, EventName: r.Form.Get("event_name"), Customer: r.Form.Get("payload[stripe_customer_id]"), Value: v}
		ev.Timestamp, _ = strconv.ParseInt(r.Form.Get("timestamp"), 10, 64)
		if prev, ok := out[id]; ok {
			if prev.EventName != ev.EventName || prev.Customer != ev.Customer || prev.Value != ev.Value {
				t.Fatalf("identifier %s sent as %+v and again as %+v", id, prev, ev)
			}
			ev.Taken, ev.Attempts = prev.Taken, prev.Attempts
		}
		ev.Taken = ev.Taken || r.Status == http.StatusOK
		ev.Attempts++
		out[id] = ev
	}
	return out
}

// MeterState returns the URL of a front for the mock that answers what
// stripe-mock cannot, since it keeps no state: the list of meters
// (meters maps event names to meter ids) and their event summaries, added
// up from the meter events taken, each identifier once, as Stripe
// deduplicates them. Every request goes to stripe-mock first, which checks
// its shape; the rest pass as they are.
func (m *Mock) MeterState(t testing.TB, meters map[string]string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequest(r.Method, m.URL+r.URL.RequestURI(), r.Body)
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		w.Header().Set("Content-Type", "application/json")
		if resp.StatusCode != http.StatusOK || r.Method != http.MethodGet || !strings.HasPrefix(r.URL.Path, "/v1/billing/meters") {
			w.WriteHeader(resp.StatusCode)
			_, _ = w.Write(body)
			return
		}
		if r.URL.Path == "/v1/billing/meters" {
			data := []map[string]any{}
			for event, id := range meters {
				data = append(data, map[string]any{"id": id, "object": "billing.meter", "event_name": event, "status": "active"})
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "url": r.URL.Path, "has_more": false, "data": data})
			return
		}
		id := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1/billing/meters/"), "/event_summaries")
		q := r.URL.Query()
		start, _ := strconv.ParseInt(q.Get("start_time"), 10, 64)
		end, _ := strconv.ParseInt(q.Get("end_time"), 10, 64)
		var sum int64
		for _, ev := range m.MeterEvents(t) {
			if ev.Taken && meters[ev.EventName] == id && ev.Customer == q.Get("customer") && ev.Timestamp >= start && ev.Timestamp < end {
				sum += ev.Value
			}
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "url": r.URL.Path, "has_more": false,
			"data": []map[string]any{{"id": "mtrsum_" + id, "object": "billing.meter_event_summary", "meter": id,
				"aggregated_value": sum, "start_time": start, "end_time": end, "livemode": false}}})
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}
