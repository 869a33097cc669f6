package console

import (
	"slices"
	"strings"

	"github.com/platformgw/gateway/internal/billing"
)

// Sums are units by unit of measure (request, token, word) and cost by
// what it is counted in (money, credits): figures of different measures
// are kept apart, never added into one "units".
type Sums struct {
	Units []measured
	Cost  []measured
}

// measured is an amount with its measure.
type measured struct {
	Value billing.Units
	Of    string
}

func addTo(list []measured, of string, v billing.Units) []measured {
	for i := range list {
		if list[i].Of == of {
			list[i].Value += v
			return list
		}
	}
	list = append(list, measured{v, of})
	slices.SortFunc(list, func(a, b measured) int { return strings.Compare(a.Of, b.Of) })
	return list
}

func (s *Sums) add(unit string, units billing.Units, kind string, cost billing.Units) {
	if units != 0 {
		s.Units = addTo(s.Units, unit, units)
	}
	if cost != 0 {
		s.Cost = addTo(s.Cost, kind, cost)
	}
}

// measureOf is what a product's units measure (its unit label, or its
// measurement type when it has none) and what its cost is counted in.
func (h *Handler) measureOf(serviceID, productID string) (unit, kind string) {
	if svc, ok := h.rt.Catalog.Service(serviceID); ok {
		if p, ok := svc.Product(productID); ok {
			return unitName(p), costKind(p)
		}
	}
	return "units of a removed product", costKind(nil)
}

// unitName names a product's unit for a chart or a total.
func unitName(p *billing.Product) string {
	if p.UnitLabel != "" {
		return p.UnitLabel
	}
	switch p.MeasurementType {
	case billing.PerRequest:
		return "request"
	case billing.PerToken:
		return "token"
	case billing.PerByte:
		return "byte"
	}
	return "unit"
}
