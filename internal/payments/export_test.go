package payments

// ForgetPackPrices empties the remembered Prices of packs, for a test
// that answers a Price otherwise than the tests before it.
func ForgetPackPrices() { priceCache.Clear() }
