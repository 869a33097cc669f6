package pgstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/platformgw/gateway/internal/store"
)

// The call outcomes (store.Outcomes) in call_outcomes (schema.go,
// migration 4): each node adds to rows of its own, and a read sums the
// nodes, so the fleet's figures are every node's counts added once.

// outcomeChunk is how many summed rows one query of a scan reads.
const outcomeChunk = 2000

// histogramLen is a stored histogram's length: the buckets and the sum.
const histogramLen = store.LatencyBuckets + 1

func histogramLiteral(l store.Latency) string {
	var b strings.Builder
	b.WriteByte('{')
	for _, n := range l.Buckets {
		b.WriteString(strconv.FormatInt(n, 10))
		b.WriteByte(',')
	}
	b.WriteString(strconv.FormatInt(l.SumMicros, 10))
	b.WriteByte('}')
	return b.String()
}

func histogramOf(v []int64) (store.Latency, error) {
	var l store.Latency
	if len(v) != histogramLen {
		return l, fmt.Errorf("outcome histogram of %d values, want %d", len(v), histogramLen)
	}
	copy(l.Buckets[:], v)
	l.SumMicros = v[store.LatencyBuckets]
	return l, nil
}

// addArrays is the SQL that adds two stored histograms element by element.
func addArrays(a, b string) string {
	return "ARRAY(SELECT x + y FROM unnest(" + a + ", " + b + ") WITH ORDINALITY AS t(x, y, i) ORDER BY i)"
}

// AddOutcomes adds the batch's rows to this node's rows unless its writer
// had this batch or a later one applied (store.Outcomes).
func (s *Store) AddOutcomes(ctx context.Context, batch store.OutcomeBatch) (bool, error) {
	if err := store.CtxErr(ctx); err != nil {
		return false, err
	}
	if err := store.CheckOutcomeBatch(batch); err != nil {
		return false, err
	}
	n := len(batch.Rows)
	hours := make([]time.Time, n)
	users, services, endpoints, products, outcomes := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	calls := make([]int64, n)
	gateway, backend := make([]string, n), make([]string, n)
	for i, r := range batch.Rows {
		hours[i] = r.Hour.UTC()
		users[i], services[i], endpoints[i], products[i], outcomes[i] = r.UserID, r.ServiceID, r.EndpointID, r.ProductID, r.Outcome
		calls[i] = r.Calls
		gateway[i], backend[i] = histogramLiteral(r.Gateway), histogramLiteral(r.Backend)
	}
	applied := false
	err := s.tx(ctx, func(tx pgx.Tx) error {
		applied = false
		tag, err := tx.Exec(ctx, `INSERT INTO call_outcome_writers (writer, node, seq, updated_at) VALUES ($1, $2, $3, now())
			ON CONFLICT (writer) DO UPDATE SET seq = excluded.seq, updated_at = excluded.updated_at
			WHERE call_outcome_writers.seq < excluded.seq`, batch.Writer, s.opts.NodeID, int64(batch.Seq))
		if err != nil || tag.RowsAffected() == 0 {
			return err // applied before: nothing to add
		}
		_, err = tx.Exec(ctx, `INSERT INTO call_outcomes AS o
			(node, hour, user_id, service_id, endpoint_id, product_id, outcome, calls, gateway, backend)
			SELECT $1, h, u, sv, e, p, oc, c, g::bigint[], b::bigint[]
			FROM unnest($2::timestamptz[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::bigint[], $9::text[], $10::text[])
				AS t(h, u, sv, e, p, oc, c, g, b)
			ON CONFLICT (hour, user_id, service_id, endpoint_id, product_id, outcome, node) DO UPDATE SET
				calls = o.calls + excluded.calls,
				gateway = `+addArrays("o.gateway", "excluded.gateway")+`,
				backend = `+addArrays("o.backend", "excluded.backend"),
			s.opts.NodeID, hours, users, services, endpoints, products, outcomes, calls, gateway, backend)
		applied = err == nil
		return err
	})
	if err != nil {
		return false, s.fail(err)
	}
	return applied, nil
}

// outcomeSums is the select list of a scan: the key, then every node's
// counts added up, element by element for the histograms.
var outcomeSums = func() string {
	var b strings.Builder
	b.WriteString("hour, user_id, service_id, endpoint_id, product_id, outcome, sum(calls)::bigint")
	for _, col := range []string{"gateway", "backend"} {
		b.WriteString(", ARRAY[")
		for i := 1; i <= histogramLen; i++ {
			if i > 1 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "sum(%s[%d])::bigint", col, i)
		}
		b.WriteString("]")
	}
	return b.String()
}()

// ScanOutcomes calls fn with the rows f selects, every node's summed, in
// key order (store.Outcomes), a chunk at a time.
func (s *Store) ScanOutcomes(ctx context.Context, f store.OutcomeFilter, fn func(store.OutcomeRow) error) error {
	if noSuchText(f.UserID, f.ServiceID, f.Outcome) {
		return nil
	}
	from, to := scanBounds(f.From, f.To)
	first, after := true, store.OutcomeKey{Hour: from}
	for {
		if err := store.CtxErr(ctx); err != nil {
			return err
		}
		rows, err := s.pool.Query(ctx, `SELECT `+outcomeSums+`
			FROM call_outcomes
			WHERE hour >= $1 AND hour < $2
			  AND ($3 OR (hour, user_id, service_id, endpoint_id, product_id, outcome) > ($4, $5, $6, $7, $8, $9))
			  AND ($10 = '' OR user_id = $10) AND ($11 = '' OR service_id = $11) AND ($12 = '' OR outcome = $12)
			GROUP BY hour, user_id, service_id, endpoint_id, product_id, outcome
			ORDER BY hour, user_id, service_id, endpoint_id, product_id, outcome LIMIT $13`,
			from, to, first, after.Hour, after.UserID, after.ServiceID, after.EndpointID, after.ProductID, after.Outcome,
			f.UserID, f.ServiceID, f.Outcome, outcomeChunk)
		if err != nil {
			return s.fail(err)
		}
		first = false
		var chunk []store.OutcomeRow
		for rows.Next() {
			var r store.OutcomeRow
			var g, b []int64
			if err := rows.Scan(&r.Hour, &r.UserID, &r.ServiceID, &r.EndpointID, &r.ProductID, &r.Outcome, &r.Calls, &g, &b); err != nil {
				rows.Close()
				return s.fail(err)
			}
			r.Hour = r.Hour.UTC()
			if r.Gateway, err = histogramOf(g); err == nil {
				r.Backend, err = histogramOf(b)
			}
			if err != nil {
				rows.Close()
				return err
			}
			chunk = append(chunk, r)
		}
		if err := rows.Err(); err != nil {
			return s.fail(err)
		}
		for _, r := range chunk {
			if err := fn(r); err != nil {
				return err
			}
		}
		if len(chunk) < outcomeChunk {
			return nil
		}
		after = chunk[len(chunk)-1].OutcomeKey
	}
}

// PruneOutcomes forgets every node's rows of hours before before's, and
// the writers idle since before (store.Outcomes).
func (s *Store) PruneOutcomes(ctx context.Context, before time.Time) (int, error) {
	if err := checkCutoff(before); err != nil {
		return 0, err
	}
	var n int64
	err := s.tx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, "DELETE FROM call_outcomes WHERE hour < $1", before.UTC().Truncate(time.Hour))
		if err != nil {
			return err
		}
		n = tag.RowsAffected()
		_, err = tx.Exec(ctx, "DELETE FROM call_outcome_writers WHERE updated_at < $1", before)
		return err
	})
	if err != nil {
		return 0, s.fail(err)
	}
	return int(n), nil
}

var _ store.Outcomes = (*Store)(nil)
