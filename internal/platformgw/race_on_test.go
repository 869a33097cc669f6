//go:build race

package platformgw_test

const raceEnabled = true
