package boltstore

import (
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// FuzzEncodeJob: a job record written by hand is byte for byte
// json.Marshal's, whatever its strings (control characters, <>&,
// U+2028/2029, invalid UTF-8), numbers and times.
func FuzzEncodeJob(f *testing.F) {
	f.Add("id", "u1", "svc", "<a>&\u2028\xff\"\\\x01\x7f", "é", 33.3, int64(0), int64(1), int64(5), 11, true, false, int32(0))
	f.Add("", "", "", "", "", 1e-7, int64(-1), int64(math.MaxInt64), int64(math.MinInt64), -1, false, true, int32(3600))
	f.Add("x", "y", "z", "\n\t\r\b\f", "\u00e9\u2029", math.Inf(1), int64(253402300799), int64(0), int64(0), 0, true, true, int32(-1))
	f.Fuzz(func(t *testing.T, id, user, svc, msg, result string, pct float64, sec, units, cost int64, size int, free, trunc bool, zone int32) {
		loc := time.UTC
		if zone != 0 {
			loc = time.FixedZone("z", int(zone%86400))
		}
		tm := time.Unix(sec%(1<<40), sec%1e9).In(loc)
		j := store.Job{ID: id, UserID: user, KeyID: msg, ServiceID: svc, EndpointID: result, ProductID: id,
			Free: free, Status: user, Stage: svc, PercentageComplete: pct, ErrorMessage: msg,
			CreatedAt: tm, UpdatedAt: tm.UTC(), ExpiresAt: time.Unix(sec, 0).UTC(), CompletedAt: tm.Add(time.Duration(units)),
			Result: result, ResultSize: size, ResultTruncated: trunc, ResultURL: msg, ContentType: result,
			Units: billing.Units(units), Cost: billing.Units(cost), CompletionDigest: svc, ReservationID: user}
		want, werr := json.Marshal(toJobRecord(j))
		got, err := encodeJob(j)
		if (err != nil) != (werr != nil) {
			t.Fatalf("error %v, json.Marshal's %v", err, werr)
		}
		if string(got) != string(want) {
			t.Fatalf("by hand:\n%s\njson.Marshal:\n%s", got, want)
		}
	})
}
