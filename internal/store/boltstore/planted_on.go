//go:build simbug_midop

package boltstore

// plantedReleaseBeforeApply, built with -tags simbug_midop, plants a bug
// for the storage simulation (simbug_midop_test.go): the applier removes
// the settlement log's segments an apply covers before the apply, not
// after its commit. When the apply is done all is as it should be, so a
// crash between two operations never shows it; power failing during the
// apply's ledger write does. Never build the gateway with this tag.
const plantedReleaseBeforeApply = true
