package usagehandler

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/subscription"
	"github.com/platformgw/gateway/internal/wire"
)

// ReportSchemaVersion is the version of the report response body
// (package wire).
const ReportSchemaVersion = wire.ReportSchemaVersion

// usageReport is a validated report body.
type usageReport struct {
	UserID    string
	ServiceID string
	Units     billing.Units
	At        time.Time // when the usage happened, as the backend says
	RequestID string    // optional: the job or call the usage belongs to
}

// report records usage a non-proxied backend reports for a user. The
// signer is the service named in the body, so the serviceId is read before
// the signature can be checked; everything else is validated after.
func (h *Handler) report(w http.ResponseWriter, r *http.Request) {
	s, e := h.readSigned(r)
	if e != nil {
		h.refuse(w, r, e)
		return
	}
	f, e := parseObject(s.body)
	if e != nil {
		h.refuse(w, r, e)
		return
	}
	serviceID, e := f.serviceID("serviceId")
	if e != nil {
		h.refuse(w, r, e)
		return
	}
	// An unknown service cannot have signed: answering 401 rather than
	// 404 keeps unsigned callers from probing the catalog.
	svc, known := h.rt.Catalog.Service(serviceID)
	if !known {
		h.refuse(w, r, h.unknownSigner(s, "report"))
		return
	}
	now := h.rt.Now()
	if e := h.verify(s, svc, now, now, "report"); e != nil {
		h.refuse(w, r, e)
		return
	}
	rep, e := h.parseReport(f, serviceID, now)
	if e != nil {
		h.refuse(w, r, e)
		return
	}
	idem := r.Header.Get("Idempotency-Key")
	if len(r.Header.Values("Idempotency-Key")) > 1 {
		// Claimed as the first, the same report with its keys in the other
		// order (a proxy that reorders or joins them) counted twice.
		h.refuse(w, r, apierror.Invalid("Idempotency-Key", "send one Idempotency-Key; nothing was recorded"))
		return
	}
	if len(idem) > 255 || strings.ContainsFunc(idem, func(c rune) bool { return c < 0x20 || c > 0x7e }) {
		h.refuse(w, r, apierror.Invalid("Idempotency-Key", "Idempotency-Key must be at most 255 printable ASCII characters"))
		return
	}

	// The status is not checked: the usage already happened, and a report
	// is the record of it (before the subscription's end or after).
	a, err := subscription.ResolveRecorded(r.Context(), svc, rep.UserID, rep.At, h.rt.Subscriptions().GetSubscription)
	if err != nil {
		h.refuse(w, r, h.accessRefusal(err))
		return
	}
	account, product := a.Account, a.Product
	entry := store.LedgerEntry{
		Time:           now.UTC(),
		UserID:         rep.UserID,
		ServiceID:      svc.ID,
		RequestID:      rep.RequestID,
		OccurredAt:     rep.At,
		Units:          rep.Units,
		Source:         store.SourceReport,
		IdempotencyKey: idem,
	}
	if product != nil {
		entry.ProductID = product.ID
	}
	body, err := h.rt.Meter().Record(r.Context(), account, entry, func(e store.LedgerEntry, st billing.State) ([]byte, error) {
		return marshal(reportBody(rep, product, st, e.Units))
	})
	switch {
	case errors.Is(err, store.ErrReplayed):
		// A retry of a report already recorded: the first answer again,
		// if it is the same report. A key reused for another user or
		// other units was answered with the first report's body, and the
		// second report was never counted, silently.
		if e := sameReport(body, rep, idem); e != nil {
			h.refuse(w, r, e)
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
	case errors.Is(err, store.ErrNoAccount):
		// Gone since it was read.
		h.refuse(w, r, h.accessRefusal(&subscription.Error{Reason: subscription.NoSubscription, ServiceID: svc.ID}))
		return
	case err != nil:
		h.refuse(w, r, h.storeError(err, "the report could not be recorded", "record report", zap.String("service", svc.ID)))
		return
	default:
		h.rt.CountUnits(svc.ID, store.SourceReport, int64(rep.Units))
	}
	writeJSON(w, http.StatusOK, body)
}

// sameReport checks that rep is the report first recorded under its
// Idempotency-Key, whose answer is first: the same user and units (its
// timestamp and requestId may differ, as a retry signs afresh). An answer
// that cannot be read is taken as the same.
func sameReport(first []byte, rep usageReport, key string) *apierror.Error {
	var was wire.ReportResult
	if json.Unmarshal(first, &was) != nil || was.UserID == rep.UserID && was.Breakdown.UnitsUsed == rep.Units {
		return nil
	}
	return apierror.Invalid("Idempotency-Key", fmt.Sprintf("Idempotency-Key %s was used for another report (userId %s, unitsUsed %s): a retry repeats its report, and another report needs a key of its own; nothing was recorded",
		apierror.QuoteID(key), apierror.QuoteID(was.UserID), was.Breakdown.UnitsUsed))
}

// parseReport validates the report fields after the signature holds.
func (h *Handler) parseReport(f fields, serviceID string, now time.Time) (usageReport, *apierror.Error) {
	rep := usageReport{ServiceID: serviceID}
	var e *apierror.Error
	if rep.UserID, e = f.userID("userId"); e != nil {
		return rep, e
	}
	units, ok, e := f.units("unitsUsed")
	if e != nil {
		return rep, e
	}
	if !ok {
		return rep, apierror.Invalid("unitsUsed", "unitsUsed is required")
	}
	if units <= 0 {
		return rep, apierror.Invalid("unitsUsed", "unitsUsed must be greater than zero")
	}
	rep.Units = units
	if rep.At, e = f.timestamp(now, time.Duration(h.rt.Limits.TimestampTolerance)); e != nil {
		return rep, e
	}
	if rep.RequestID, e = f.requestID("requestId"); e != nil {
		return rep, e
	}
	return rep, nil
}

// reportBody describes the subscription after the report; a service
// owner's usage is recorded free, outside any billing cycle.
func reportBody(rep usageReport, p *billing.Product, st billing.State, units billing.Units) wire.ReportResult {
	out := wire.ReportResult{
		ReportSchemaVersion: ReportSchemaVersion,
		Status:              "ok",
		UserID:              rep.UserID,
		ServiceID:           rep.ServiceID,
	}
	if p == nil {
		out.Breakdown = billing.Breakdown{UnitsUsed: units}
		return out
	}
	out.BillingModelType = &p.BillingModel
	out.MeasurementType = &p.MeasurementType
	out.UnitLabel = &p.UnitLabel
	out.Breakdown = billing.Summarize(*p, st, units, true)
	if out.Breakdown.IsOverLimit {
		w := overLimitWarning(*p, st)
		out.Warning = &w
	}
	return out
}

// overLimitWarning names the hard limits the subscription is past.
func overLimitWarning(p billing.Product, st billing.State) string {
	var past []string
	if p.Quota != nil && st.Used > *p.Quota && !p.OverageAllowed() {
		past = append(past, "the quota of "+p.Quota.String()+" "+p.UnitLabel+" per period")
	}
	if p.BillingModel == billing.Prepaid && st.Credits < 0 {
		past = append(past, "the prepaid credits")
	}
	if p.SpendingCap != nil && st.Spend > *p.SpendingCap {
		past = append(past, "the spending cap of "+p.SpendingCap.String())
	}
	return "usage recorded past " + strings.Join(past, " and ")
}

// writeJSON sends a JSON body.
func writeJSON(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body)
}
