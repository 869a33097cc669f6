package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/pgtest"
)

// TestUnitBoundSQLAsGo: the lease statement's cap on units
// (unitBoundSQL) and spend in a cost unit (spendInSQL), computed in
// PostgreSQL from the row, are billing.HardLimits.UnitsBound and
// row.spendIn, which the node's own budget (row.left) and judge use:
// across prices whose cost rounds half up (billing.Mul) at a millionth
// (0.3, 0.499999, 0.5, 0.500001, 1.234567), caps met exactly or passed,
// negative spend (corrections), units used past the quota, quotas and
// caps at billing.MaxUnits, and rows whose spend is in the cap's unit,
// in another (spend_other holding the cap's or not), or in none (schema
// 7), for a currency and for the unit "" of a listing that names none.
// A node that computed a larger bound than the database would lease
// units the statement refuses, a smaller one refuse what it admits.
// The statement divided in numeric with "/", which rounds a quotient of
// more than 16 significant digits to a whole number where floor was
// meant: a cap of 100000 USD at 0.000003 a unit (3 USD a million
// tokens) bounded the overage at 33333333333.5 units, half a unit's
// millionth more than Decide allows (33333333333.499999), and a cap of
// 1e12 at 0.5 at 2e12 units and a millionth.
func TestUnitBoundSQLAsGo(t *testing.T) {
	ctx := context.Background()
	s := openNode(t, pgtest.DB(t), "a")
	q := strings.NewReplacer("$12", "$1", "$15", "$2", "$16", "$3", "$17", "$4").Replace(
		`SELECT (` + unitBoundSQL + `)::text, (` + spendInSQL + `)::text FROM (
			SELECT unnest($5::bigint[]) AS used, unnest($6::bigint[]) AS spend, unnest($7::text[]) AS spend_unit,
				unnest($8::text[])::jsonb AS spend_other, generate_subscripts($5::bigint[], 1) AS i) allowances ORDER BY i`)
	type rowCase struct {
		used billing.Units
		r    row
	}
	maxU := billing.MaxUnits
	prices := []billing.Units{1, 3, 7, 300_000, 499_999, 500_000, 500_001, 999_999, billing.Whole(1), 1_234_567, billing.Whole(3), maxU}
	caps := []billing.Units{0, 1, 2_999_999, billing.Whole(3), billing.Whole(10), billing.Whole(100_000), maxU}
	quotas := []billing.Units{0, billing.Whole(5), maxU}
	useds := []billing.Units{0, billing.Whole(4), billing.Whole(5), billing.Whole(6), billing.Whole(30), maxU}
	spends := []billing.Units{-billing.Whole(5), 0, 1, 400_000, billing.Whole(2), 2_999_999, billing.Whole(3), billing.Whole(4), maxU}
	checked, wrong := 0, 0
	for _, unit := range []string{"USD", ""} {
		var rows []rowCase
		for _, used := range useds {
			for _, sp := range spends {
				other := func(m map[string]int64) string {
					b, _ := json.Marshal(m)
					return string(b)
				}
				rows = append(rows,
					rowCase{used, row{spend: sp}}, // schema 7: no unit
					rowCase{used, row{spend: sp, unit: unit, unitSet: true}},
					rowCase{used, row{spend: billing.Whole(999), unit: "credits", unitSet: true,
						other: other(map[string]int64{unit: int64(sp), "EUR": 7})}},
					rowCase{used, row{spend: sp, unit: "credits", unitSet: true, other: other(map[string]int64{"EUR": int64(sp)})}},
				)
			}
		}
		var us, ss []int64
		var units, others []*string
		for _, rc := range rows {
			us, ss = append(us, int64(rc.used)), append(ss, int64(rc.r.spend))
			var u, o *string
			if rc.r.unitSet {
				u = &rc.r.unit
			}
			if rc.r.other != "" {
				o = &rc.r.other
			}
			units, others = append(units, u), append(others, o)
		}
		var lims []billing.HardLimits
		for _, price := range prices {
			for _, quota := range quotas {
				for _, c := range append([]*billing.Units{nil}, ptrs(caps)...) {
					qq := quota
					lims = append(lims, billing.HardLimits{Units: &qq, OverageCap: c, Price: price, Unit: unit})
				}
			}
		}
		b := &pgx.Batch{}
		for _, l := range lims {
			b.Queue(q, int64(*l.Units), nullable(l.OverageCap), int64(l.Price), l.Unit, us, ss, units, others)
		}
		br := s.pool.SendBatch(ctx, b)
		for _, l := range lims {
			res, err := br.Query()
			if err != nil {
				t.Fatal(err)
			}
			i := 0
			for res.Next() {
				var boundText, spendText string
				if err := res.Scan(&boundText, &spendText); err != nil {
					t.Fatal(err)
				}
				rc := rows[i]
				i++
				spend := rc.r.spendIn(l.Unit)
				if spendText != fmt.Sprint(int64(spend)) {
					t.Errorf("unit %q, row %+v: spendInSQL %s, spendIn %d", l.Unit, rc.r, spendText, spend)
				}
				got, ok := new(big.Int).SetString(boundText, 10)
				if !ok {
					t.Fatalf("bound %q is not a whole number", boundText)
				}
				if got.Cmp(big.NewInt(math.MaxInt64)) > 0 {
					got.SetInt64(math.MaxInt64) // UnitsBound saturates
				}
				want := l.UnitsBound(rc.used, spend)
				if got.Int64() != int64(want) && t.Failed() {
					wrong++
				} else if got.Int64() != int64(want) {
					wrong++
					cp := "none"
					if l.OverageCap != nil {
						cp = l.OverageCap.String()
					}
					t.Errorf("quota %s, cap %s, price %s, unit %q; used %s, row %+v: unitBoundSQL %s, UnitsBound %s",
						*l.Units, cp, l.Price, l.Unit, rc.used, rc.r, boundText, want)
				}
				checked++
			}
			if err := res.Err(); err != nil {
				t.Fatal(err)
			}
			if i != len(rows) {
				t.Fatalf("%d rows back, want %d", i, len(rows))
			}
		}
		if err := br.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if checked == 0 {
		t.Fatal("nothing checked")
	}
	if wrong > 0 {
		t.Errorf("%d of %d bounds differ (the first shown)", wrong, checked)
	}
}

func ptrs(us []billing.Units) []*billing.Units {
	out := make([]*billing.Units, len(us))
	for i := range us {
		out[i] = &us[i]
	}
	return out
}
