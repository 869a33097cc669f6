package console

import (
	"strings"

	"github.com/platformgw/gateway/internal/apierror"
)

// fieldWords are the admin API's field names as a person says them.
var fieldWords = strings.NewReplacer(
	"expiresAt", "the expiry date",
	"serviceId", "the service",
	"productId", "the product",
	"userId", "the user id",
	"parentKeyId", "the parent key",
)

// knownMessages are the operations' errors an operator meets in the
// console's forms, in the words of the form rather than of the API.
var knownMessages = map[string]string{
	"expiresAt is in the past": "The expiry date is in the past.",
	"amount is required":       "Enter an amount of credits.",
	"amount must not be zero":  "The amount must not be zero.",
	"amount must be a decimal number with at most 6 decimal places, such as 10.5 or -2": "The amount must be a number such as 10.5 or -2, with at most 6 decimal places.",
	"productId is required": "Choose a product.",
}

// humanMessage words an operation's error for the console: a known
// message as the form would say it, any other with the API's field
// names replaced, starting with a capital and ending with a full stop.
// The admin API keeps its own wording; only the console's differs.
func humanMessage(e *apierror.Error) string {
	if m, ok := knownMessages[e.Message]; ok {
		return m
	}
	m := fieldWords.Replace(e.Message)
	if m == "" {
		return m
	}
	m = strings.ToUpper(m[:1]) + m[1:]
	if !strings.HasSuffix(m, ".") {
		m += "."
	}
	return m
}
