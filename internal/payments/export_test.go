package payments

// ForgetPackPrices empties the remembered Prices of packs, for a test
// that answers a Price otherwise than the tests before it.
func ForgetPackPrices() { priceCache.Clear() }

// OnAnotherNode runs f, the handling of an event by another node, from
// inside this node's handling of a subscription's event (a test's store
// hook): without this process's subMu, which the other node, another
// process, does not share.
func OnAnotherNode(f func()) {
	if subMu.TryLock() { // this node holds none (it is not applying one)
		subMu.Unlock()
		f()
		return
	}
	subMu.Unlock()
	defer subMu.Lock()
	f()
}
