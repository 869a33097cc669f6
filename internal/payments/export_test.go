package payments

// ForgetPackPrices empties the remembered Prices of packs, for a test
// that answers a Price otherwise than the tests before it.
func ForgetPackPrices() { priceCache.Clear() }

// OnAnotherNode runs f, the handling of an event by another node, from
// inside this node's handling of a subscription's event (a test's store
// hook): without the turns (subTurns) this process holds, which the other
// node, another process, does not share. A test applies one event at a
// time on "this node", so every turn held is that event's.
func OnAnotherNode(f func()) {
	subTurns.mu.Lock()
	var held []*keyedLock
	for _, l := range subTurns.locks {
		if l.TryLock() {
			l.Unlock() // free (only waited for)
			continue
		}
		held = append(held, l)
	}
	subTurns.mu.Unlock()
	for _, l := range held {
		l.Unlock()
	}
	defer func() {
		for _, l := range held {
			l.Lock()
		}
	}()
	f()
}
