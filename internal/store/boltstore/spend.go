package boltstore

import "github.com/platformgw/gateway/internal/billing"

// A period's spend is kept per cost unit (billing.Product.CostUnit): a
// counter's spend is the spend in its unit, other the spend in each other
// unit. A spending cap, its alerts and the summaries count only the spend
// in their product's unit; one sum counted credits spent under a PREPAID
// product against a USD cap after a change of product. A counter written
// before has no unit: all its spend is counted in the unit of the first
// product that charges it, which is what it was counted against then
// (until then it counts in whatever unit it is read in, as a PostgreSQL
// row from before schema version 8 does). The records of the settlement
// log name the unit of their charges (partUnit); one written before names
// none and charges the counter's unit. The spend held by calls in flight stays one sum.

// inUnit makes u the counter's unit: the spend in its former unit moves
// to other, and what other held in u becomes its spend. A counter without
// a unit that holds spend (written before) keeps none, its spend counted
// in u, until a charge gives it one (charged), as the database's counter
// takes one only with a charge: taking the unit of the first product that
// read it here counted the spend in that unit until the next start and in
// the charging product's after it.
func (c *memCounter) inUnit(u string) {
	if !c.unitSet {
		if c.spend == 0 && len(c.other) == 0 {
			c.unit, c.unitSet = u, true
		}
		return
	}
	if c.unit == u {
		return
	}
	if c.spend != 0 {
		if c.other == nil {
			c.other = map[string]billing.Units{}
		}
		c.other[c.unit] += c.spend
	}
	c.spend = c.other[u]
	delete(c.other, u)
	c.unit = u
}

// charged gives a counter without a unit u, the unit of its first charge
// (the record's acctChange.unit): its spend so far counts in u.
func (c *memCounter) charged(u string) {
	if !c.unitSet {
		c.unit, c.unitSet = u, true
	}
}

// inUnit is memCounter.inUnit for a counter as stored, which only
// charges call (applyState.apply): a counter without a unit takes u.
func (c *counter) inUnit(u string) {
	if c.Unit == nil || *c.Unit == u {
		c.Unit = &u
		return
	}
	if c.Spend != 0 {
		if c.Other == nil {
			c.Other = map[string]amount{}
		}
		c.Other[*c.Unit] += c.Spend
	}
	c.Spend = c.Other[u]
	delete(c.Other, u)
	if len(c.Other) == 0 {
		c.Other = nil
	}
	c.Unit = &u
}

// spendTotal is the counter's spend in every unit together: what its
// ledger rows' costs sum to.
func (c counter) spendTotal() amount {
	t := c.Spend
	for _, v := range c.Other {
		t += v
	}
	return t
}

// otherUnits is the counter's spend in its other units, nil when none.
func (c counter) otherUnits() map[string]billing.Units {
	if len(c.Other) == 0 {
		return nil
	}
	m := make(map[string]billing.Units, len(c.Other))
	for u, v := range c.Other {
		m[u] = billing.Units(v)
	}
	return m
}
