package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fieldgate/fieldgate/internal/relrecord"
)

func TestFuzzResult(t *testing.T) {
	log := `fuzz: elapsed: 0s, gathering baseline coverage: 0/40 completed
fuzz: elapsed: 3s, execs: 1000 (333/sec), new interesting: 1 (total: 41)
fuzz: elapsed: 30s, execs: 123456 (4115/sec), new interesting: 3 (total: 43)
PASS
`
	r := fuzzResult("matcher FuzzIndex", log, 0, 0)
	if !r.Pass || r.Suite != "fuzz" {
		t.Fatalf("%+v", r)
	}
	want := []relrecord.Figure{{Name: "elapsed", Value: "30 s"}, {Name: "executions", Value: "123456"}, {Name: "per second", Value: "4115"}, {Name: "corpus", Value: "43"}}
	if len(r.Figures) != len(want) {
		t.Fatalf("figures %+v, want %+v", r.Figures, want)
	}
	for i := range want {
		if r.Figures[i] != want[i] {
			t.Errorf("figure %d: %+v, want %+v", i, r.Figures[i], want[i])
		}
	}
	bad := fuzzResult("storage FuzzDecode", log+"--- FAIL: FuzzDecode (0.01s)\n", 1, 0)
	if bad.Pass || !strings.HasPrefix(bad.Failure, "--- FAIL: FuzzDecode") {
		t.Errorf("failed run: %+v", bad)
	}
	// A rerun after Go's deadline race says so in its figures.
	again := fuzzResult("matcher FuzzIndex", log, 0, 1)
	if n := len(again.Figures); !again.Pass || n != len(want)+1 || again.Figures[n-1].Name != "reruns" || !strings.Contains(again.Figures[n-1].Value, "75804") {
		t.Errorf("rerun: %+v", again)
	}
}

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	put := func(r relrecord.Result) {
		b, _ := json.Marshal(r)
		if err := os.WriteFile(filepath.Join(dir, r.Suite+"--"+r.Case+".json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	put(relrecord.Result{Suite: "bad-config", Case: "check", Mode: "short", Pass: true, Figures: []relrecord.Figure{{Name: "configs", Value: "40"}}})
	put(relrecord.Result{Suite: "crash", Case: "qos1", Mode: "short", Pass: true, Figures: []relrecord.Figure{{Name: "lost", Value: "0"}, {Name: "a|b", Value: "x"}}})
	recs, err := load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].Suite != "crash" || recs[1].Suite != "bad-config" {
		t.Fatalf("order: %+v", recs)
	}
	var b bytes.Buffer
	writeReport(&b, recs, env{machine: "m", goVersion: "go1.0"}, "make soak")
	out := b.String()
	for _, want := range []string{"# Reliability", "| crash | qos1 | short | pass |", `| a\|b | x |`, "## Bridge outages", "Not run in this run.", "2 cases, 0 failed."} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}

	put(relrecord.Result{Suite: "crash", Case: "qos2", Mode: "short", Pass: false, Failure: "3 lost"})
	outPath := filepath.Join(t.TempDir(), "R.md")
	err = writeCmd([]string{"-dir", dir, "-out", outPath})
	if err == nil || !strings.Contains(err.Error(), "1 of 3 cases failed") {
		t.Errorf("a failed case: err %v", err)
	}
	got, rerr := os.ReadFile(outPath)
	if rerr != nil || !strings.Contains(string(got), "**FAIL**") || !strings.Contains(string(got), "Failure: 3 lost") {
		t.Errorf("report with a failure: %v\n%s", rerr, got)
	}
	if err := writeCmd([]string{"-dir", t.TempDir(), "-out", outPath}); err == nil {
		t.Error("no records: no error")
	}

	// Every case passed, but a required suite left no record.
	okDir := t.TempDir()
	rb, _ := json.Marshal(relrecord.Result{Suite: "crash", Case: "qos1", Pass: true})
	if err := os.WriteFile(filepath.Join(okDir, "c.json"), rb, 0o644); err != nil {
		t.Fatal(err)
	}
	err = writeCmd([]string{"-dir", okDir, "-out", outPath, "-require", "crash,malformed"})
	if err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Errorf("a required suite without records: err %v", err)
	}
	if err := writeCmd([]string{"-dir", okDir, "-out", outPath, "-require", "crash"}); err != nil {
		t.Errorf("every required suite present: %v", err)
	}
	// A failure without a record of its own.
	if err := failCmd([]string{"-dir", okDir, "-case", "go test ./x", "-detail", "exit status 2"}); err != nil {
		t.Fatal(err)
	}
	err = writeCmd([]string{"-dir", okDir, "-out", outPath, "-require", "crash"})
	if err == nil || !strings.Contains(err.Error(), "1 of 2 cases failed") {
		t.Errorf("a recorded run failure: err %v", err)
	}
}

// TestSuiteSections checks that every suite make test requires (its
// REL_SUITES) has a section of its own in the report, in which its cases
// render with their figures, rather than the one line an unknown suite
// gets.
func TestSuiteSections(t *testing.T) {
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	var required []string
	for _, line := range strings.Split(string(mk), "\n") {
		if rest, ok := strings.CutPrefix(line, "REL_SUITES :="); ok {
			required = strings.Split(strings.TrimSpace(rest), ",")
		}
	}
	if len(required) == 0 {
		t.Fatal("no REL_SUITES line in the Makefile")
	}
	for _, id := range required {
		var recs []relrecord.Result
		recs = append(recs, relrecord.Result{Suite: id, Case: "a case", Mode: "short", Pass: true, Figures: []relrecord.Figure{{Name: "lost", Value: "0"}}})
		var b bytes.Buffer
		writeReport(&b, recs, env{machine: "m", goVersion: "go1.0"}, "make soak")
		out := b.String()
		title := ""
		for _, s := range suites {
			if s.id == id {
				title = s.title
			}
		}
		if title == "" {
			t.Errorf("suite %s, which make test requires, has no section in the report", id)
			continue
		}
		if !strings.Contains(out, "## "+title+"\n") || !strings.Contains(out, "### a case: pass") || !strings.Contains(out, "| lost | 0 |") {
			t.Errorf("suite %s does not render its case under %q:\n%s", id, title, out)
		}
	}
}
