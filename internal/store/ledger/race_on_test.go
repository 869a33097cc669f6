//go:build race

package ledger_test

// raceOn scales the big tests down under the race detector, which makes
// them ten times slower without finding more.
const raceOn = true
