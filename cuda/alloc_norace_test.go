//go:build !race

package cuda

const allocRaceEnabled = false
