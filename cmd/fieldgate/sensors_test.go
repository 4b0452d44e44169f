package main

import (
	"strings"
	"testing"
)

// TestSensorsScan runs the shipped binary's bus scan on the simulated bus
// and on a bus that does not exist.
func TestSensorsScan(t *testing.T) {
	r := runBinary(t, "sensors", "scan", "-bus", "sim")
	if r.code != 0 {
		t.Fatalf("sensors scan -bus sim: code %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{
		"     0  1  2  3  4  5  6  7  8  9  a  b  c  d  e  f\n",
		"\n40: 40 -- -- -- 44 -- -- -- 48 -- -- -- -- -- -- --\n",
		"\n70: -- -- -- -- -- -- 76 --\n",
		"\n0x40  ",
		"\n0x44  SHT3x (status register)",
		"\n0x48  ",
		"\n0x76  BME280 (chip id 0x60)",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
		}
	}
	if n := strings.Count(r.stdout, "\n0x"); n != 4 {
		t.Errorf("%d devices listed, want the 4 simulated ones:\n%s", n, r.stdout)
	}

	r = runBinary(t, "sensors", "scan", "-bus", "99")
	if r.code != exitFail || !strings.Contains(r.stderr, "/dev/i2c-99") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("sensors scan -bus 99: code %d, want 1 and one line naming /dev/i2c-99:\n%s", r.code, r.stderr)
	}
	r = runBinary(t, "sensors", "scan", "-bus", "x")
	if r.code != exitFail || !strings.Contains(r.stderr, `"x" is not an I²C bus`) {
		t.Errorf("sensors scan -bus x: code %d:\n%s", r.code, r.stderr)
	}
	for _, args := range [][]string{{"sensors"}, {"sensors", "probe"}, {"sensors", "scan", "sim"}} {
		if r := runBinary(t, args...); r.code != exitUsage || !strings.Contains(r.stderr, "sensors scan") {
			t.Errorf("%v: code %d, want %d with usage:\n%s", args, r.code, exitUsage, r.stderr)
		}
	}
}
