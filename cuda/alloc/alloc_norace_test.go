//go:build !race

package alloc

const allocRaceEnabled = false
