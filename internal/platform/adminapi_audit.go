package platform

import (
	"net/http"

	"github.com/platformgw/gateway/internal/ops"
)

// auditPage is a page of the audit log, newest first.
type auditPage struct {
	Entries    []ops.AuditRecord `json:"entries"`
	NextCursor string            `json:"nextCursor,omitempty"`
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
	entries, next, err := app.ops.AuditLog(r.Context(), cursor, limit)
	if err != nil {
		return err
	}
	page := auditPage{Entries: make([]ops.AuditRecord, len(entries)), NextCursor: next}
	for i, e := range entries {
		page.Entries[i] = ops.ViewAuditEntry(e)
	}
	return writeJSON(w, http.StatusOK, page)
}
