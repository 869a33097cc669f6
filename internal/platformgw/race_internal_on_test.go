//go:build race

package platformgw

const raceDetector = true
