package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSummaryCommand(t *testing.T) {
	dir := t.TempDir()
	raw := filepath.Join(dir, "broker-amd64.txt")
	if err := os.WriteFile(raw, []byte("BenchmarkBroker/fieldgate/qos0-10x10 1 480000 msgs/s\nBenchmarkBroker/mochi/qos0-10x10 1 160000 msgs/s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "broker-summary.md")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"summary", "-o", out, "broker", raw}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	written, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(written, stdout.Bytes()) {
		t.Error("the summary printed is not the one written")
	}
	if want := "| throughput ≥ 1.5× mochi, every throughput scenario | ✓ lowest 3.00× (qos0-10x10) |"; !strings.Contains(string(written), want) {
		t.Errorf("summary lacks %q:\n%s", want, written)
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"table"}, {"summary", "broker"}, {"summary", "nothing", "raw.txt"}, {"report", "extra"}} {
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != exitUsage {
			t.Errorf("run(%q) = %d, want %d", args, code, exitUsage)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"summary", "broker", filepath.Join(t.TempDir(), "missing.txt")}, &stdout, &stderr); code != exitFail {
		t.Errorf("a missing raw file: exit %d, want %d", code, exitFail)
	}
}
