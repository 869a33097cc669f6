package boltstore

import "time"

// The storage simulation's hooks (sim_test.go; docs/reliability.md, §14).
// A simulated run must be one sequence of file operations, the same for the
// same seed, so that a failure replays bit for bit: nothing may run on a
// goroutine of its own or read the wall clock into what it writes.
var (
	// inlineBackground runs the settlement log's writer in the goroutine
	// that waits for a record (settlelog.Options.Inline) and starts no
	// ledger sealer (segledger.Options.ManualSeal): the simulation seals
	// when its schedule says (Store.led.SealPending).
	inlineBackground bool
	// ledgerSealBytes is the ledger's seal size (0: its default); the
	// simulation makes it small to see segments seal within a run.
	ledgerSealBytes int64
	// ledgerNow is the ledger's clock: the creation times in its segment
	// headers and the age that seals a segment.
	ledgerNow = time.Now
)
