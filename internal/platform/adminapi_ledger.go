package platform

import (
	"compress/gzip"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/apierror"
	"github.com/platformgw/gateway/internal/ops"
	"github.com/platformgw/gateway/internal/store"
)

// The ledger at scale (docs/operations.md, "The usage ledger"): exports
// compressed on request, hourly rollups instead of raw rows, and pruning
// of old raw rows. Rollups and pruning are optional store interfaces
// (internal/store/ledger_api.go), kept by both stores; a store without them
// answers not_supported.

// rollupHour is the one rollup granularity: ?rollup=hour.
const rollupHour = "hour"

// codeNotSupported refuses what the configured store cannot do, with 501.
const codeNotSupported = "not_supported"

func notSupported(w http.ResponseWriter, what string) error {
	writeErrorStatus(w, http.StatusNotImplemented, apierror.New(codeNotSupported,
		"this store does not keep "+what+"; the bbolt and PostgreSQL stores do (see docs/operations.md)"))
	return nil
}

// wantGzip says whether to compress an export: ?gzip=true or false
// decides; without it, a client that accepts gzip (Accept-Encoding: gzip,
// as Go's and curl --compressed's do) gets it.
func wantGzip(r *http.Request) (bool, error) {
	q := r.URL.Query()
	if q.Has("gzip") {
		v, err := strconv.ParseBool(q.Get("gzip"))
		if err != nil {
			return false, apierror.Invalid("gzip", "gzip must be true or false")
		}
		return v, nil
	}
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(name), "gzip") {
			q, found := strings.CutPrefix(strings.ReplaceAll(params, " ", ""), "q=")
			if !found {
				return true, nil
			}
			v, err := strconv.ParseFloat(q, 64)
			return err == nil && v > 0, nil
		}
	}
	return false, nil
}

// exportEncoder writes the rows of one export format.
type exportEncoder[T any] interface {
	contentType() string
	begin(w io.Writer) error
	entry(w io.Writer, row T) error
	end(w io.Writer) error
}

// streamExport streams the rows scan produces. Headers go out with the
// first row, so a store failure before any row is still an ordinary JSON
// error; a failure after part of the export is out cuts the connection, so
// the client sees a truncated transfer rather than a short export.
func streamExport[T any](a *adminAPI, w http.ResponseWriter, r *http.Request, enc exportEncoder[T], filename string, gz bool,
	scan func(fn func(T) error) error) error {
	var zw *gzip.Writer
	out := &lazyWriter{w: w, start: func() {
		h := w.Header()
		h.Set("Content-Type", enc.contentType())
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Add("Vary", "Accept-Encoding")
		if filename != "" {
			h.Set("Content-Disposition", `attachment; filename="`+filename+`"`)
		}
		if gz {
			h.Set("Content-Encoding", "gzip")
		}
		w.WriteHeader(http.StatusOK)
	}}
	var sink io.Writer = out
	if gz {
		// BestSpeed: an export is CPU-bound already, and the level
		// gains little on rows that repeat their field names.
		zw, _ = gzip.NewWriterLevel(out, gzip.BestSpeed)
		sink = flushingGzip{zw}
	}
	buf := newFlushWriter(sink)
	count := 0
	err := scan(func(row T) error {
		if count == 0 {
			if err := enc.begin(buf); err != nil {
				return err
			}
		}
		count++
		return enc.entry(buf, row)
	})
	if err == nil {
		if count == 0 {
			err = enc.begin(buf)
		}
		if err == nil {
			err = enc.end(buf)
		}
		if err == nil {
			err = buf.Flush()
		}
		if err == nil && zw != nil {
			err = zw.Close()
		}
	}
	if err == nil {
		return nil
	}
	if !out.started {
		return fmt.Errorf("export usage: %w", err)
	}
	if r.Context().Err() == nil {
		a.logger.Error("usage export failed midway", zap.Int("entries_sent", count), zap.Error(err))
	}
	panic(http.ErrAbortHandler)
}

// flushingGzip flushes the compressor after every write of the export's
// buffer (32 KiB of rows), so a compressed export streams as a plain one
// does: the client sees rows as they are read, and a failure midway cuts
// a transfer that has begun rather than one that has not.
type flushingGzip struct{ zw *gzip.Writer }

func (f flushingGzip) Write(p []byte) (int, error) {
	n, err := f.zw.Write(p)
	if err == nil {
		err = f.zw.Flush()
	}
	return n, err
}

// exportRollups: GET /platform/usage?rollup=hour, the hourly rollups in
// (hour, user, service, endpoint, product) order, with the export's
// filters (from and to select hours) and formats.
func (a *adminAPI) exportRollups(app *App, w http.ResponseWriter, r *http.Request, f store.LedgerFilter, format string, gz bool) error {
	rr, ok := app.DataStore().(store.RollupReader)
	if !ok {
		return notSupported(w, "hourly rollups")
	}
	var enc exportEncoder[ops.RollupRow]
	filename := ""
	switch format {
	case formatJSON:
		enc = &jsonArrayOf[ops.RollupRow]{}
	case formatNDJSON:
		enc = ndjsonOf[ops.RollupRow]{}
	case formatCSV:
		enc = &csvOf[ops.RollupRow]{columns: ops.RollupCSVColumns(), row: ops.RollupCSVRow}
		filename = "usage-hourly.csv"
	}
	rf := store.RollupFilter(f)
	cat := app.Catalog()
	return streamExport(a, w, r, enc, filename, gz, func(fn func(ops.RollupRow) error) error {
		return rr.ScanRollups(r.Context(), rf, func(x store.Rollup) error {
			return fn(ops.RollupRow{Rollup: x, CostUnit: ops.CostUnit(cat, x.ServiceID, x.ProductID)})
		})
	})
}

type jsonArrayOf[T any] struct{ n int }

func (*jsonArrayOf[T]) contentType() string { return "application/json" }
func (*jsonArrayOf[T]) begin(w io.Writer) error {
	_, err := io.WriteString(w, "[")
	return err
}

func (j *jsonArrayOf[T]) entry(w io.Writer, row T) error {
	b, err := json.Marshal(row)
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

func (j *jsonArrayOf[T]) end(w io.Writer) error {
	closing := "\n]\n"
	if j.n == 0 {
		closing = "]\n"
	}
	_, err := io.WriteString(w, closing)
	return err
}

type ndjsonOf[T any] struct{}

func (ndjsonOf[T]) contentType() string   { return "application/x-ndjson" }
func (ndjsonOf[T]) begin(io.Writer) error { return nil }
func (ndjsonOf[T]) end(io.Writer) error   { return nil }
func (ndjsonOf[T]) entry(w io.Writer, row T) error {
	b, err := json.Marshal(row)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

type csvOf[T any] struct {
	columns []string
	row     func(T) []string
	cw      *csv.Writer
}

func (*csvOf[T]) contentType() string { return "text/csv; charset=utf-8" }

func (c *csvOf[T]) begin(w io.Writer) error {
	c.cw = csv.NewWriter(w)
	return c.cw.Write(c.columns)
}

func (c *csvOf[T]) entry(_ io.Writer, row T) error { return c.cw.Write(c.row(row)) }

func (c *csvOf[T]) end(io.Writer) error {
	c.cw.Flush()
	return c.cw.Error()
}

// pruneUsage: POST /platform/usage/prune?before=<RFC 3339 or date>
// removes the raw ledger rows older than before, in whole segments, and
// answers what went (store.PruneResult). Rollups stay.
func (a *adminAPI) pruneUsage(app *App, w http.ResponseWriter, r *http.Request, _ []string) error {
	q := r.URL.Query()
	if err := checkQuery(q, "before"); err != nil {
		return err
	}
	if !q.Has("before") {
		return apierror.Invalid("before", "before is required: the time (RFC 3339) or date before which raw rows go")
	}
	before, err := ops.ParseTimeBound(q.Get("before"), false)
	if err != nil || before.IsZero() {
		return apierror.Invalid("before", "before must be an RFC 3339 time or a date (YYYY-MM-DD)")
	}
	res, err := app.ops.PruneLedger(r.Context(), adminActor(r), before)
	if errors.Is(err, ops.ErrNotSupported) {
		return notSupported(w, "a prunable ledger")
	}
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

// pruneLedger is the maintenance side of ledger_retention and
// rollup_retention: at most once an hour, when set and the store can.
func (a *App) pruneLedger(ctx context.Context, t time.Time) {
	if a.LedgerRetention <= 0 && a.RollupRetention <= 0 {
		return
	}
	if last := a.lastLedgerPrune.Load(); last != 0 && t.Sub(time.Unix(0, last)) < time.Hour {
		return
	}
	a.lastLedgerPrune.Store(t.UnixNano())
	a.ops.ApplyRetention(ctx, t, time.Duration(a.LedgerRetention), time.Duration(a.RollupRetention))
}
