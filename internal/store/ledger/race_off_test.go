//go:build !race

package ledger_test

const raceOn = false
