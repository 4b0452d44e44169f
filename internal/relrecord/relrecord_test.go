package relrecord

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestWrite runs a passing and a failing case in subtests and reads back
// what each left in the output directory.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(OutEnv, dir)
	t.Setenv(SoakEnv, "")

	t.Run("pass", func(t *testing.T) {
		rec := Begin(t, "suite", "good case")
		rec.Add("messages", "%d", 42)
	})
	// A failing subtest would fail this test too; a fake TB stands in.
	ft := &fakeTB{TB: t}
	rec := Begin(ft, "suite", "bad/case")
	rec.Add("lost", "%d", 3)
	rec.Fail("%d messages lost", 3)
	ft.failed = true
	for i := len(ft.cleanups) - 1; i >= 0; i-- {
		ft.cleanups[i]()
	}

	good := read(t, filepath.Join(dir, "suite--good_case.json"))
	if !good.Pass || good.Mode != "short" || len(good.Figures) != 1 || good.Figures[0] != (Figure{"messages", "42"}) {
		t.Errorf("good case: %+v", good)
	}
	bad := read(t, filepath.Join(dir, "suite--bad_case.json"))
	if bad.Pass || bad.Failure != "3 messages lost" || bad.Figures[0].Value != "3" {
		t.Errorf("bad case: %+v", bad)
	}
}

func TestPick(t *testing.T) {
	t.Setenv(SoakEnv, "")
	if Pick(1, 2) != 1 {
		t.Error("short run picked the soak value")
	}
	t.Setenv(SoakEnv, "1")
	if Pick(1, 2) != 2 {
		t.Error("soak run picked the short value")
	}
}

func read(t *testing.T, path string) Result {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r Result
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

type fakeTB struct {
	testing.TB
	failed   bool
	cleanups []func()
}

func (f *fakeTB) Failed() bool        { return f.failed }
func (f *fakeTB) Cleanup(fn func())   { f.cleanups = append(f.cleanups, fn) }
func (f *fakeTB) Name() string        { return "TestFake" }
func (f *fakeTB) Logf(string, ...any) {}
