package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/store"
)

// AuditTopUpResolve is the audit action of a top-up paid and not granted
// that an operator marked resolved (ResolveNotGranted).
const AuditTopUpResolve = "topup.resolve"

// AuditTopUpGrantSkipped is the audit action of the paid event of a
// top-up marked resolved that came later and granted nothing; the actor
// is "stripe".
const AuditTopUpGrantSkipped = "topup.grant_skipped_resolved"

// MaxResolveNote is how long a resolution's note may be, in characters.
const MaxResolveNote = 200

// CheckResolveNote is a resolution's note as kept (spaces trimmed), or
// why it is refused: longer than MaxResolveNote characters, not UTF-8,
// or with a control character (a line break included: it is one line in
// a table and the audit log).
func CheckResolveNote(note string) (string, error) {
	note = strings.TrimSpace(note)
	switch {
	case !utf8.ValidString(note) || strings.ContainsFunc(note, unicode.IsControl):
		return "", apierror.Invalid("note", "The note must be one line of text, without control characters.")
	case utf8.RuneCountInString(note) > MaxResolveNote:
		return "", apierror.Invalid("note", fmt.Sprintf("The note must be at most %d characters (it has %d).", MaxResolveNote, utf8.RuneCountInString(note)))
	}
	return note, nil
}

// NotGrantedTopUp reads the top-up paid and not granted of PaymentIntent
// id, as the Revenue page lists it: an ignored top-up record that is not
// another gateway's (Foreign) and has no top-up record (a grant made
// since). Anything else is an apierror NotFound that says which.
func NotGrantedTopUp(ctx context.Context, pay store.Payments, id string) (IgnoredTopUp, error) {
	var ig IgnoredTopUp
	b, err := pay.GetPaymentRecord(ctx, KindTopUpIgnored, id)
	if errors.Is(err, store.ErrNotFound) || err == nil && json.Unmarshal(b, &ig) == nil && ig.Foreign {
		return ig, apierror.New(apierror.NotFound, "No top-up paid and not granted has the Stripe payment "+id+".")
	}
	if err != nil {
		return ig, fmt.Errorf("read the ignored top-up %s: %w", id, err)
	}
	if err := json.Unmarshal(b, &ig); err != nil {
		return ig, fmt.Errorf("ignored top-up record %s does not parse: %w", id, err)
	}
	switch _, err := pay.GetPaymentRecord(ctx, KindTopUp, id); {
	case err == nil:
		return ig, apierror.New(apierror.NotFound, "The top-up of Stripe payment "+id+" was granted since: it is a top-up like any other, not one paid and not granted.")
	case !errors.Is(err, store.ErrNotFound):
		return ig, fmt.Errorf("read the top-up %s: %w", id, err)
	}
	return ig, nil
}

// ResolveNotGranted marks the top-up paid and not granted of
// PaymentIntent id resolved by by (the operator) at at, with note
// (CheckResolveNote), on its ignored top-up record: the operator refunded
// it in Stripe or granted its credits by hand. It returns the record and
// whether this call marked it: one marked before is left as it was (who,
// when and note of the first), so a second mark changes nothing. A
// refund, dispute or paid event of it coming later keeps the mark
// (keepIgnored changes the record, it does not replace it).
func ResolveNotGranted(ctx context.Context, pay store.Payments, id, by, note string, at time.Time) (IgnoredTopUp, bool, error) {
	note, err := CheckResolveNote(note)
	if err != nil {
		return IgnoredTopUp{}, false, err
	}
	if ig, err := NotGrantedTopUp(ctx, pay, id); err != nil || ig.Resolved != nil {
		return ig, false, err
	}
	return changeRecord(ctx, pay, KindTopUpIgnored, id, at, func(ig *IgnoredTopUp) bool {
		if ig.Resolved != nil {
			return false
		}
		ig.Resolved = &TopUpResolution{By: by, At: at.UTC(), Note: note}
		return true
	})
}

// notGrantedCursor starts the cursors of ListNotGranted, so that another
// listing's cursor is refused rather than read as a PaymentIntent.
const notGrantedCursor = "ng:"

// maxNotGrantedScan bounds the ignored top-up records one page of
// ListNotGranted reads: a page of a filter few match may be short and
// still have a next cursor.
const maxNotGrantedScan = 10000

// ListNotGranted is a page of the top-ups paid and not granted, as the
// Revenue page lists them (not another gateway's, not granted since), in
// PaymentIntent order: status "open" those not marked resolved,
// "resolved" those marked, "" both. cursor is "" or a next cursor it
// returned; limit at least 1. The next cursor is "" at the end.
func ListNotGranted(ctx context.Context, pay store.Payments, status, cursor string, limit int) ([]IgnoredTopUp, string, error) {
	if status != "" && status != "open" && status != "resolved" {
		return nil, "", apierror.Invalid("status", "status is open or resolved; leave it out for both")
	}
	after, ok := strings.CutPrefix(cursor, notGrantedCursor)
	if cursor != "" && (!ok || after == "") {
		return nil, "", apierror.Invalid("cursor", "cursor is not one this listing returned; start again without it")
	}
	out := []IgnoredTopUp{}
	scanned := 0
	for r, err := range store.PaymentRecords(ctx, pay, KindTopUpIgnored, after) {
		if err != nil {
			return nil, "", fmt.Errorf("list the ignored top-ups: %w", err)
		}
		if len(out) == limit || scanned == maxNotGrantedScan {
			return out, notGrantedCursor + after, nil
		}
		scanned++
		after = r.ID
		var ig IgnoredTopUp
		if err := json.Unmarshal(r.Body, &ig); err != nil {
			return nil, "", fmt.Errorf("ignored top-up record %s does not parse: %w", r.ID, err)
		}
		if ig.Foreign || status == "open" && ig.Resolved != nil || status == "resolved" && ig.Resolved == nil {
			continue
		}
		switch _, err := pay.GetPaymentRecord(ctx, KindTopUp, r.ID); {
		case err == nil:
			continue // granted since: a top-up
		case !errors.Is(err, store.ErrNotFound):
			return nil, "", fmt.Errorf("read the top-up %s: %w", r.ID, err)
		}
		out = append(out, ig)
	}
	return out, "", nil
}
