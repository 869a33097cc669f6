//go:build !race

package platformgw

const raceDetector = false
