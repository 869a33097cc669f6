package catalog

import (
	"fmt"

	"github.com/platformgw/gateway/internal/alerts"
)

// ProductAlerts are the usage alert thresholds of one product of a
// service (Caddyfile: `alert` lines in the product block).
type ProductAlerts struct {
	Product    string             `json:"product"`
	Thresholds []alerts.Threshold `json:"thresholds"`
}

// compileAlerts checks each product's thresholds against that product.
func (s *Service) compileAlerts() error {
	s.alerts = make(map[string][]alerts.Threshold, len(s.Alerts))
	for _, pa := range s.Alerts {
		if pa == nil {
			return fmt.Errorf("service %s: empty alerts entry", s.ID)
		}
		p, ok := s.products[pa.Product]
		if !ok {
			return fmt.Errorf("service %s: alerts for product %q, which the service does not have", s.ID, pa.Product)
		}
		if _, dup := s.alerts[pa.Product]; dup {
			return fmt.Errorf("service %s: alerts for product %s given twice", s.ID, pa.Product)
		}
		if err := alerts.ValidateAll(*p, pa.Thresholds); err != nil {
			return fmt.Errorf("service %s: %w", s.ID, err)
		}
		s.alerts[pa.Product] = pa.Thresholds
	}
	return nil
}

// AlertThresholds are the usage alert thresholds of a product; none when
// the product has none or the service has no such product.
func (s *Service) AlertThresholds(productID string) []alerts.Threshold {
	return s.alerts[productID]
}

// HasAlerts reports whether any service of the catalog sets alerts.
func (c *Catalog) HasAlerts() bool {
	for _, s := range c.services {
		if len(s.alerts) > 0 {
			return true
		}
	}
	return false
}
