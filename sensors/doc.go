// Package sensors reads the devices wired to the gateway and publishes
// their readings into the broker.
//
// A driver is one file that defines a Kind, and kinds.go lists every kind
// in one table; the configuration's kind: selects one by name, and the
// driver's Parse checks its options without touching hardware, so
// `fieldgate check` reports a bad option with its file and line. Buses are opened through periph.io (I²C through
// /dev/i2c-N, GPIO through the character device, 1-Wire through the
// kernel's w1 directory) or the simulated hardware of package sim.
//
// The contract: a sensor that fails never stops the others; every failure
// is counted by reason (no answer, checksum, implausible value, timeout) and
// none is published as a reading.
package sensors
