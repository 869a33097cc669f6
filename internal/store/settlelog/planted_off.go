//go:build !simbug

package settlelog

// plantedAckBeforeSync is the storage simulation's planted bug, off: a
// constant, so the check costs the production build nothing.
const plantedAckBeforeSync = false
