//go:build !race

package testkit

// raceFactor is 1 without the race detector: deadlines are as written.
const raceFactor = 1
