package payments

import (
	"os"
	"strings"
	"testing"
)

// TestHandledEventsDocumented: the events to enable on Stripe's webhook
// endpoint, as docs/payments.md lists them, are the ones the gateway
// handles.
func TestHandledEventsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/payments.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range HandledEvents() {
		if !strings.Contains(string(doc), "- `"+ev+"`") {
			t.Errorf("docs/payments.md does not list %s among the events to enable", ev)
		}
	}
}
