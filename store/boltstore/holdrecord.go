package boltstore

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/platformgw/gateway/billing"
)

// productJSONMax bounds the products whose JSON the commit loop keeps.
const productJSONMax = 256

// encodeReservation writes a hold's record as json.Marshal writes it (any
// JSON reader decodes it the same), with the product's JSON made once per
// product rather than on every hold: every sync call writes one, inside
// the single commit loop, and reflecting over the whole product was most
// of the cost of the hold. Only the commit loop calls it.
func (s *Store) encodeReservation(r reservation) ([]byte, error) {
	d := r.Decision
	if !utf8.ValidString(r.UserID) || !utf8.ValidString(r.ServiceID) || !utf8.ValidString(r.JobID) ||
		!utf8.ValidString(d.Code) || !utf8.ValidString(d.Reason) {
		return json.Marshal(r) // its replacement of invalid bytes, exactly
	}
	pj, ok := s.productJSON[r.Product]
	if !ok {
		var err error
		if pj, err = json.Marshal(r.Product); err != nil {
			return nil, err
		}
		if len(s.productJSON) >= productJSONMax {
			clear(s.productJSON)
		}
		s.productJSON[r.Product] = pj
	}
	b := make([]byte, 0, 192+len(r.UserID)+len(r.ServiceID)+len(pj)+len(d.Code)+len(d.Reason)+len(r.JobID))
	b = append(b, `{"userId":`...)
	b = appendJSONString(b, r.UserID)
	b = append(b, `,"serviceId":`...)
	b = appendJSONString(b, r.ServiceID)
	b = append(b, `,"product":`...)
	b = append(b, pj...)
	b = append(b, `,"decision":{"Allowed":`...)
	b = strconv.AppendBool(b, d.Allowed)
	b = append(b, `,"Code":`...)
	b = appendJSONString(b, d.Code)
	b = append(b, `,"Reason":`...)
	b = appendJSONString(b, d.Reason)
	b = append(b, `,"Units":`...)
	b = append(b, billing.Units(d.Units).String()...)
	b = append(b, `,"Overage":`...)
	b = append(b, billing.Units(d.Overage).String()...)
	b = append(b, `,"Cost":`...)
	b = append(b, billing.Units(d.Cost).String()...)
	b = append(b, '}')
	b = append(b, `,"period":`...)
	b = strconv.AppendInt(b, r.PeriodKey, 10)
	if r.JobID != "" {
		b = append(b, `,"jobId":`...)
		b = appendJSONString(b, r.JobID)
	}
	return append(b, '}'), nil
}

// appendJSONString appends s, valid UTF-8, as a JSON string.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
