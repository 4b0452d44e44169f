package footprint

import (
	"os"
	"testing"
	"time"
)

func TestParseStatTimes(t *testing.T) {
	// A command name with a space and a parenthesis, as a process may
	// name itself.
	stat := "4242 (field gate) S 1 4242 4242 0 -1 4194560 1180 0 0 0 731 402 0 0 20 0 9 0 170 1300000000 4000 18446744073709551615\n"
	u, s, err := parseStatTimes(stat)
	if err != nil || u != 731 || s != 402 {
		t.Errorf("parseStatTimes = %d, %d, %v; want 731, 402", u, s, err)
	}
	if _, _, err := parseStatTimes("4242 (x) S 1 2"); err == nil {
		t.Error("a short stat line parsed")
	}
}

func TestParseSchedstat(t *testing.T) {
	run, n, err := parseSchedstat("6088305 7713033 21\n")
	if err != nil || run != 6088305 || n != 21 {
		t.Errorf("parseSchedstat = %d, %d, %v; want 6088305, 21", run, n, err)
	}
	if _, _, err := parseSchedstat("1 2"); err == nil {
		t.Error("a short schedstat parsed")
	}
}

func TestParseSwitches(t *testing.T) {
	status := "Name:\tfieldgate\nThreads:\t9\nvoluntary_ctxt_switches:\t150\nnonvoluntary_ctxt_switches:\t7\n"
	if got := parseSwitches(status); got != 157 {
		t.Errorf("parseSwitches = %d, want 157", got)
	}
}

// The test's own process: its CPU time grows while it works, and its
// threads are counted.
func TestReadProcTimes(t *testing.T) {
	before, err := readProcTimes(os.Getpid())
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	// Spin until the kernel has counted at least two clock ticks more.
	for deadline := time.Now().Add(10 * time.Second); ; {
		now, err := readProcTimes(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if now.utime+now.stime >= before.utime+before.stime+2 {
			if now.runNS <= before.runNS || now.threads < 1 {
				t.Errorf("run time %d -> %d ns, %d threads; want growth and at least one thread", before.runNS, now.runNS, now.threads)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("CPU time stayed at %d ticks for 10 s of spinning", now.utime+now.stime)
		}
	}
}
