//go:build race

package testkit

// raceFactor stretches deadlines under the race detector, which makes
// code 2 to 20 times slower (its documentation's range) and is how `make
// test` runs every unit test. The tests' own deadlines already allow for
// an unloaded run with it; 3 is the room for the detector's cost on top of
// a machine that other work shares.
const raceFactor = 3
