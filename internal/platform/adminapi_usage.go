package platform

import (
	"bufio"
	"encoding/csv"
	"io"
	"net/http"
	"strings"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
)

// The usage export, GET /platform/usage: the raw ledger in time order,
// streamed from the store's chunked scan in JSON, NDJSON or CSV (the
// hourly rollups and the stream itself are in adminapi_ledger.go).

// Usage export formats.
const (
	formatJSON   = "json"   // one JSON array, written entry by entry
	formatNDJSON = "ndjson" // one JSON object per line
	formatCSV    = "csv"    // a header row, then one row per entry
)

// exportUsage: GET /platform/usage?userId=&serviceId=&from=&to=&format=
// &rollup=hour&gzip=. It streams the ledger in time order straight from
// the store's chunked scan to the client, so a ledger of any size is
// exported in bounded memory; rollup=hour exports the hourly rollups
// instead (adminapi_ledger.go), gzip compresses either.
func (a *adminAPI) exportUsage(app *App, w http.ResponseWriter, r *http.Request, _ []string) error {
	q := r.URL.Query()
	if err := checkQuery(q, "userId", "serviceId", "from", "to", "format", "gzip", "rollup"); err != nil {
		return err
	}
	f := store.LedgerFilter{UserID: q.Get("userId"), ServiceID: q.Get("serviceId")}
	if q.Has("userId") {
		if err := ops.CheckUserID("userId", f.UserID); err != nil {
			return err
		}
	}
	if q.Has("serviceId") && !catalog.ValidID(f.ServiceID) {
		return apierror.Invalid("serviceId", "serviceId is not a valid id")
	}
	var err error
	if f.From, err = ops.ParseTimeBound(q.Get("from"), false); err != nil {
		return apierror.Invalid("from", "from must be an RFC 3339 time or a date (YYYY-MM-DD)")
	}
	if f.To, err = ops.ParseTimeBound(q.Get("to"), true); err != nil {
		return apierror.Invalid("to", "to must be an RFC 3339 time or a date (YYYY-MM-DD)")
	}
	if !f.From.IsZero() && !f.To.IsZero() && !f.From.Before(f.To) {
		return apierror.Invalid("to", "to must be after from")
	}
	format := strings.ToLower(q.Get("format"))
	if format == "" {
		format = formatJSON
	}
	if q.Has("rollup") && q.Get("rollup") != rollupHour {
		return apierror.Invalid("rollup", "rollup must be hour (hourly sums per subscription, endpoint and product)")
	}
	var enc ledgerEncoder
	switch format {
	case formatJSON:
		enc = &jsonArrayEncoder{cat: app.Catalog()}
	case formatNDJSON:
		enc = &ndjsonEncoder{cat: app.Catalog()}
	case formatCSV:
		enc = &csvEncoder{cat: app.Catalog()}
	default:
		return apierror.Invalid("format", "format must be json, ndjson or csv")
	}

	gz, err := wantGzip(r)
	if err != nil {
		return err
	}
	if q.Has("rollup") {
		return a.exportRollups(app, w, r, f, format, gz)
	}
	filename := ""
	if format == formatCSV {
		filename = "usage.csv"
	}
	return streamExport(a, w, r, enc, filename, gz, func(fn func(store.LedgerEntry) error) error {
		return app.DataStore().ScanLedger(r.Context(), f, fn)
	})
}

// lazyWriter calls start before its first write.
type lazyWriter struct {
	w       io.Writer
	start   func()
	started bool
}

func (l *lazyWriter) Write(p []byte) (int, error) {
	if !l.started {
		l.started = true
		l.start()
	}
	return l.w.Write(p)
}

// newFlushWriter buffers small entry writes into larger chunks.
func newFlushWriter(w io.Writer) *bufio.Writer { return bufio.NewWriterSize(w, 32<<10) }

// ledgerEncoder writes ledger entries in one export format.
type ledgerEncoder interface {
	contentType() string
	begin(w io.Writer) error
	entry(w io.Writer, e store.LedgerEntry) error
	end(w io.Writer) error
}

// jsonArrayEncoder writes a JSON array; cat names each cost's unit.
type jsonArrayEncoder struct {
	n   int
	cat *catalog.Catalog
}

func (*jsonArrayEncoder) contentType() string { return "application/json" }
func (*jsonArrayEncoder) begin(w io.Writer) error {
	_, err := io.WriteString(w, "[")
	return err
}

func (j *jsonArrayEncoder) entry(w io.Writer, e store.LedgerEntry) error {
	b, err := ops.UsageJSON(e, ops.CostUnit(j.cat, e.ServiceID, e.ProductID))
	if err != nil {
		return err
	}
	sep := ",\n"
	if j.n == 0 {
		sep = "\n"
	}
	j.n++
	if _, err := io.WriteString(w, sep); err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

func (j *jsonArrayEncoder) end(w io.Writer) error {
	closing := "\n]\n"
	if j.n == 0 {
		closing = "]\n"
	}
	_, err := io.WriteString(w, closing)
	return err
}

// ndjsonEncoder writes one JSON row a line; cat names each cost's unit.
type ndjsonEncoder struct{ cat *catalog.Catalog }

func (*ndjsonEncoder) contentType() string   { return "application/x-ndjson" }
func (*ndjsonEncoder) begin(io.Writer) error { return nil }
func (*ndjsonEncoder) end(io.Writer) error   { return nil }
func (n *ndjsonEncoder) entry(w io.Writer, e store.LedgerEntry) error {
	b, err := ops.UsageJSON(e, ops.CostUnit(n.cat, e.ServiceID, e.ProductID))
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// csvEncoder writes the CSV export; cat names each cost's unit.
type csvEncoder struct {
	cw  *csv.Writer
	cat *catalog.Catalog
}

func (*csvEncoder) contentType() string { return "text/csv; charset=utf-8" }

func (c *csvEncoder) begin(w io.Writer) error {
	c.cw = csv.NewWriter(w)
	return c.cw.Write(ops.UsageCSVColumns())
}

func (c *csvEncoder) entry(_ io.Writer, e store.LedgerEntry) error {
	return c.cw.Write(ops.UsageCSVRow(e, ops.CostUnit(c.cat, e.ServiceID, e.ProductID)))
}

func (c *csvEncoder) end(io.Writer) error {
	c.cw.Flush()
	return c.cw.Error()
}
