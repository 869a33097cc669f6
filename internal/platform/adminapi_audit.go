package platform

import (
	"context"
	"fmt"
	"net/http"

	"github.com/platformgw/gateway/internal/store"
)

// auditPage is a page of the audit log, newest first.
type auditPage struct {
	Entries    []auditRecord `json:"entries"`
	NextCursor string        `json:"nextCursor,omitempty"`
}

// listAudit: GET /platform/audit[?limit=&cursor=], the operator changes
// newest first.
func (a *adminAPI) listAudit(app *App, w http.ResponseWriter, r *http.Request, _ []string) error {
	q := r.URL.Query()
	if err := checkQuery(q, "limit", "cursor"); err != nil {
		return err
	}
	limit, cursor, err := pageParams(q)
	if err != nil {
		return err
	}
	entries, next, err := app.AuditLog(r.Context(), cursor, limit)
	if err != nil {
		return err
	}
	page := auditPage{Entries: make([]auditRecord, len(entries)), NextCursor: next}
	for i, e := range entries {
		page.Entries[i] = viewAuditEntry(e)
	}
	return writeJSON(w, http.StatusOK, page)
}

// AuditLog reads a page of the audit log, newest first; limit is 1 to
// 1000 (the admin API's page sizes).
func (app *App) AuditLog(ctx context.Context, cursor string, limit int) ([]store.AuditEntry, string, error) {
	limit = min(max(limit, 1), maxPageLimit)
	entries, next, err := app.DataStore().ListAudit(ctx, cursor, limit)
	if e := badCursor(err); e != nil {
		return nil, "", e
	}
	if err != nil {
		return nil, "", fmt.Errorf("list audit log: %w", err)
	}
	if entries == nil {
		entries = []store.AuditEntry{}
	}
	return entries, next, nil
}
