package boltstore

import (
	"encoding/json"
	"math"
	"strconv"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// encodeCounter writes a counter as json.Marshal writes it.
func encodeCounter(c counter) []byte {
	b := make([]byte, 0, 96)
	b = append(b, `{"used":`...)
	b = append(b, billing.Units(c.Used).String()...)
	for _, f := range []struct {
		name string
		v    amount
	}{{`,"reserved":`, c.Reserved}, {`,"spend":`, c.Spend}, {`,"reservedSpend":`, c.ReservedSpend}} {
		if f.v != 0 {
			b = append(b, f.name...)
			b = append(b, billing.Units(f.v).String()...)
		}
	}
	if c.Unit != nil {
		b = append(b, `,"unit":`...)
		b = store.AppendJSONString(b, *c.Unit)
	}
	if len(c.Other) > 0 {
		o, _ := json.Marshal(c.Other) // rare: a change of cost unit within a period
		b = append(b, `,"other":`...)
		b = append(b, o...)
	}
	return append(b, '}')
}

// encodeJob writes a job record as json.Marshal writes toJobRecord(j)
// (what the store file holds and every reader of it decodes), without
// reflection: every async invoke stores one. Anything the fast path does
// not write byte for byte as encoding/json does (a time outside UTC or
// years 0-9999, a percentage in exponent form) goes to json.Marshal;
// strings are escaped as encoding/json escapes them
// (store.AppendJSONString).
func encodeJob(j store.Job) ([]byte, error) {
	n := 384 + len(j.Result) + len(j.ErrorMessage)
	if j.Terms != nil && j.Terms.Product != nil {
		n += 256 // a product's JSON is 150-250 bytes: no second buffer
	}
	if b, ok := appendJob(make([]byte, 0, n), j); ok {
		return b, nil
	}
	return json.Marshal(toJobRecord(j))
}

func appendJob(b []byte, j store.Job) ([]byte, bool) {
	ok := true
	str := func(name, v string, omitEmpty bool) {
		if omitEmpty && v == "" {
			return
		}
		b = append(b, name...)
		b = store.AppendJSONString(b, v)
	}
	tm := func(name string, t time.Time) {
		b = append(b, name...)
		if y := t.Year(); t.Location() != time.UTC || y < 0 || y > 9999 {
			ok = false
			return
		}
		b = append(b, '"')
		b = t.AppendFormat(b, time.RFC3339Nano)
		b = append(b, '"')
	}
	str(`{"requestId":`, j.ID, false)
	str(`,"userId":`, j.UserID, false)
	str(`,"keyId":`, j.KeyID, true)
	str(`,"serviceId":`, j.ServiceID, false)
	str(`,"endpointId":`, j.EndpointID, false)
	str(`,"productId":`, j.ProductID, true)
	if j.Free {
		b = append(b, `,"free":true`...)
	}
	str(`,"status":`, j.Status, false)
	str(`,"currentStage":`, j.Stage, true)
	b = append(b, `,"percentageComplete":`...)
	if f := j.PercentageComplete; f == 0 || (math.Abs(f) >= 1e-6 && math.Abs(f) < 1e21) {
		b = strconv.AppendFloat(b, f, 'f', -1, 64)
	} else {
		ok = false
	}
	str(`,"errorMessage":`, j.ErrorMessage, true)
	tm(`,"startTime":`, j.CreatedAt)
	tm(`,"updatedAt":`, j.UpdatedAt)
	tm(`,"expiresAt":`, j.ExpiresAt)
	if !j.CompletedAt.IsZero() {
		tm(`,"completedAt":`, j.CompletedAt)
	}
	str(`,"result":`, j.Result, true)
	if j.ResultSize != 0 {
		b = append(b, `,"size":`...)
		b = strconv.AppendInt(b, int64(j.ResultSize), 10)
	}
	if j.ResultTruncated {
		b = append(b, `,"resultTruncated":true`...)
	}
	str(`,"resultUrl":`, j.ResultURL, true)
	str(`,"contentType":`, j.ContentType, true)
	if j.Units != 0 {
		b = append(b, `,"units":`...)
		b = append(b, j.Units.String()...)
	}
	if j.Cost != 0 {
		b = append(b, `,"cost":`...)
		b = append(b, j.Cost.String()...)
	}
	str(`,"completionDigest":`, j.CompletionDigest, true)
	str(`,"reservationId":`, j.ReservationID, true)
	if t := j.Terms; t != nil {
		b = append(b, `,"terms":{`...)
		if t.Product != nil {
			b = append(b, `"product":`...)
			b = store.AppendProductJSON(b, t.Product)
			b = append(b, ',')
		}
		b = append(b, `"endpointCost":`...)
		b = append(b, t.EndpointCost.String()...)
		if t.Product != nil && t.Product.Currency != "" {
			b = append(b, `,"currency":`...)
			b = store.AppendJSONString(b, t.Product.Currency)
		}
		b = append(b, '}')
	}
	return append(b, '}'), ok
}
