package console

import (
	"slices"
	"strings"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/catalog"
)

// Sums are units by unit of measure (request, token, word) and cost by
// what it is counted in (credits, or money in one currency: costKind):
// figures of different measures are kept apart, never added into one
// "units", and credits are never added to money nor one currency to
// another.
type Sums struct {
	Units []measured
	Cost  []measured
}

// measured is an amount with its measure: a unit label for units, a cost
// kind (kindFor) for a cost.
type measured struct {
	Value billing.Units
	Of    string
}

func addTo(list []measured, of string, v billing.Units) []measured {
	for i := range list {
		if list[i].Of == of {
			list[i].Value = billing.SatAdd(list[i].Value, v)
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
// measurement type when it has none) and what its cost is counted in
// (kindFor).
func (h *Handler) measureOf(serviceID, productID string) (unit, kind string) {
	if svc, ok := h.rt.Catalog.Service(serviceID); ok {
		if p, ok := svc.Product(productID); ok {
			return p.UnitName(), kindFor(serviceID, productID, p)
		}
	}
	return "units of removed product " + serviceID + "/" + productID, kindFor(serviceID, productID, nil)
}

// kindCredits is the cost kind of PREPAID products: credits, which are
// not money (they were bought with money once, and that money is revenue
// of its own: the Revenue page).
const kindCredits = "credits"

// costKind names what a product's prices are counted in: a PREPAID
// product's in credits, the others' in money, named by the currency of
// the product's catalog listing ("EUR"); "" when that is not known (the
// listing names no currency, or the product is no longer in the catalog:
// nil). kindFor names the unknown ones.
func costKind(p *billing.Product) string {
	switch {
	case p != nil && p.BillingModel == billing.Prepaid:
		return kindCredits
	case p != nil && p.Currency != "":
		return p.Currency
	}
	return ""
}

// kindFor is what the cost of serviceID's productID (p; nil when it is no
// longer in the catalog) is counted in: its costKind, or, when that is not
// known, a kind of that product's own that says so. Two products whose
// currency is unknown may be in different currencies (or one in credits),
// so their amounts are never added together or to anything else.
func kindFor(serviceID, productID string, p *billing.Product) string {
	if k := costKind(p); k != "" {
		return k
	}
	if p == nil {
		return "of removed product " + serviceID + "/" + productID + " (credits or currency unknown)"
	}
	return "of " + serviceID + "/" + productID + " (its listing names no currency)"
}

// isCurrency reports whether a cost kind is money in a known currency.
func isCurrency(kind string) bool { return catalog.CheckCurrency(kind) == nil }

// formatCost writes an amount with what it is counted in: money with its
// currency's minor digits and code ("29.00 EUR", "500 JPY"), credits as
// credits ("12.5 credits"), an amount of unknown kind with the words of
// its kind.
//
// Nothing at all of an unknown kind (the cost of a product that charges
// no money, a free plan whose listing names no currency) is "—": no
// amount is owed in any currency, and naming the product's missing
// currency would only make a zero look like a debt.
func formatCost(v billing.Units, kind string) string {
	switch {
	case v == 0 && kind != kindCredits && !isCurrency(kind):
		return "—"
	case kind == kindCredits:
		return v.String() + " credits"
	case isCurrency(kind):
		return catalog.Money{Amount: v, Currency: kind}.String()
	}
	return v.String() + " " + kind
}

// costNumber is an amount alone, for a table or chart whose heading names
// its kind: money with its currency's minor digits ("29.00").
func costNumber(v billing.Units, kind string) string {
	if isCurrency(kind) {
		return catalog.FormatAmount(v, kind)
	}
	return v.String()
}

// formatCosts writes amounts of different kinds side by side ("29.00
// EUR, 500 JPY, 12 credits"), never as one sum.
func formatCosts(ms []measured) string {
	var parts []string
	for _, m := range ms {
		if s := formatCost(m.Value, m.Of); s != "—" {
			parts = append(parts, s)
		}
	}
	if len(parts) == 0 {
		return "—"
	}
	return strings.Join(parts, ", ")
}
