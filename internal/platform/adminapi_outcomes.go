package platform

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
)

// The hourly call outcomes (store.Outcomes): GET /platform/outcomes, the
// export of the stored rows, and GET /platform/outcomes/summary, the
// series grouped by one dimension (ops.Outcomes). Both first add what
// this process has counted to the store, so a read right after a call
// sees it; another node's last few seconds are not in yet.

// exportOutcomes: GET /platform/outcomes?userId=&serviceId=&outcome=&from=
// &to=&format=&gzip=, the rows in (hour, user, service, endpoint, product,
// outcome) order, every node's summed, streamed like the usage export.
func (a *adminAPI) exportOutcomes(app *App, w http.ResponseWriter, r *http.Request, _ []string) error {
	q := r.URL.Query()
	if err := checkQuery(q, "userId", "serviceId", "outcome", "from", "to", "format", "gzip"); err != nil {
		return err
	}
	oq, err := ops.ParseOutcomeQuery(q)
	if err != nil {
		return err
	}
	var enc exportEncoder[store.OutcomeRow]
	filename := ""
	switch format := strings.ToLower(q.Get("format")); format {
	case formatJSON, "":
		enc = &jsonArrayOf[store.OutcomeRow]{}
	case formatNDJSON:
		enc = ndjsonOf[store.OutcomeRow]{}
	case formatCSV:
		enc = &csvOf[store.OutcomeRow]{columns: ops.OutcomeCSVColumns(), row: ops.OutcomeCSVRow}
		filename = "outcomes-hourly.csv"
	default:
		return apierror.Invalid("format", "format must be json, ndjson or csv")
	}
	gz, err := wantGzip(r)
	if err != nil {
		return err
	}
	o, ok := app.DataStore().(store.Outcomes)
	if !ok {
		return notSupported(w, "call outcomes")
	}
	app.Ops().FlushOutcomes(r.Context()) // this node's counts added first
	return streamExport(a, w, r, enc, filename, gz, func(fn func(store.OutcomeRow) error) error {
		return o.ScanOutcomes(r.Context(), oq.OutcomeFilter, fn)
	})
}

// outcomeSummary: GET /platform/outcomes/summary?by=&hourly=&userId=
// &serviceId=&outcome=&from=&to=, an ops.OutcomeSeries.
func (a *adminAPI) outcomeSummary(app *App, w http.ResponseWriter, r *http.Request, _ []string) error {
	q := r.URL.Query()
	if err := checkQuery(q, "userId", "serviceId", "outcome", "from", "to", "by", "hourly"); err != nil {
		return err
	}
	oq, err := ops.ParseOutcomeQuery(q)
	if err != nil {
		return err
	}
	series, err := app.Ops().Outcomes(r.Context(), oq) // this node's counts added first
	if errors.Is(err, ops.ErrNoOutcomes) {
		return notSupported(w, "call outcomes")
	}
	if err != nil {
		return fmt.Errorf("read call outcomes: %w", err)
	}
	return writeJSON(w, http.StatusOK, series)
}
