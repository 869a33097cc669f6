//go:build !simbug_midop

package boltstore

// plantedReleaseBeforeApply is the storage simulation's planted bug that
// only a crash during an operation finds, off: a constant, so the check
// costs the production build nothing.
const plantedReleaseBeforeApply = false
