package pgstore

import (
	"github.com/platformgw/gateway/internal/billing"
)

// limitsOf is the product's hard limits as the lease statement bounds
// them; which limits a product has is billing's rule (HardLimits).
func limitsOf(p billing.Product) Limits { return Limits(p.HardLimits()) }
