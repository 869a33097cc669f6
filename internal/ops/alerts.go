package ops

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/store"
)

// alertStatuses are the states an alert listing filters on.
var alertStatuses = []string{store.AlertPending, store.AlertDelivered, store.AlertFailed}

// AlertQuery selects a page of alerts; empty fields match every alert.
type AlertQuery struct {
	UserID    string
	ServiceID string
	Status    string // PENDING, DELIVERED or FAILED
	Cursor    string
	Limit     int // 1 to 1000; 0 is the default page size
}

// AlertPage is a page of alerts, newest first.
type AlertPage struct {
	Alerts     []store.Alert `json:"alerts"`
	NextCursor string        `json:"nextCursor,omitempty"`
}

// ListAlerts lists the usage alerts of the store: the admin API's GET
// /platform/alerts and the console show it. A bad filter or cursor is an
// *apierror.Error.
func (o *Ops) ListAlerts(ctx context.Context, q AlertQuery) (AlertPage, error) {
	if q.UserID != "" {
		if err := CheckUserID("userId", q.UserID); err != nil {
			return AlertPage{}, err
		}
	}
	if q.ServiceID != "" && !catalog.ValidID(q.ServiceID) {
		return AlertPage{}, apierror.Invalid("serviceId", "serviceId is not a valid id")
	}
	q.Status = strings.ToUpper(q.Status)
	if q.Status != "" && !slices.Contains(alertStatuses, q.Status) {
		return AlertPage{}, apierror.Invalid("status", "status must be one of "+strings.Join(alertStatuses, ", "))
	}
	if q.Limit == 0 {
		q.Limit = DefaultPageLimit
	}
	if q.Limit < 1 || q.Limit > MaxPageLimit {
		return AlertPage{}, apierror.Invalid("limit", fmt.Sprintf("limit must be a whole number from 1 to %d", MaxPageLimit))
	}
	list, next, err := o.rt.Store().ListAlerts(ctx, store.AlertFilter{UserID: q.UserID, ServiceID: q.ServiceID, Status: q.Status}, q.Cursor, q.Limit)
	if e := BadCursor(err); e != nil {
		return AlertPage{}, e
	}
	if err != nil {
		return AlertPage{}, fmt.Errorf("list alerts: %w", err)
	}
	if list == nil {
		list = []store.Alert{}
	}
	return AlertPage{Alerts: list, NextCursor: next}, nil
}
