// Package relrecord records the outcome of the reliability suite's tests
// (make soak, and its short subset in make test) so that
// scripts/relreport can write docs/RELIABILITY.md from what was measured,
// not from what was expected.
//
// A test calls Begin, adds figures as it measures them, and the record is
// written when the test ends, passed or failed, into the directory named
// by FIELDGATE_RELIABILITY_OUT. Without that variable nothing is written.
package relrecord

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// OutEnv names the directory the records are written to.
const OutEnv = "FIELDGATE_RELIABILITY_OUT"

// SoakEnv, set to 1, selects the long durations and counts of make soak.
const SoakEnv = "FIELDGATE_SOAK"

// Soak reports whether the suite runs at make soak's length rather than
// the short subset make test runs.
func Soak() bool { return os.Getenv(SoakEnv) == "1" }

// Pick returns soak under make soak and short otherwise: one place for
// each test's two sizes.
func Pick[T any](short, soak T) T {
	if Soak() {
		return soak
	}
	return short
}

// Figure is one measured value of a case, already formatted.
type Figure struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Result is one case's record, as written to disk.
type Result struct {
	Suite    string   `json:"suite"`
	Case     string   `json:"case"`
	Mode     string   `json:"mode"`
	Pass     bool     `json:"pass"`
	Failure  string   `json:"failure,omitempty"`
	Seconds  float64  `json:"seconds"`
	Figures  []Figure `json:"figures"`
	Test     string   `json:"test"`
	Finished string   `json:"finished"`
}

// Rec collects one case's figures until its test ends.
type Rec struct {
	mu      sync.Mutex
	t       testing.TB
	start   time.Time
	res     Result
	failure []string
}

// Begin starts the record of case name in suite (for example "crash",
// "qos1+bridge") for the test t; it is written when t ends.
func Begin(t testing.TB, suite, name string) *Rec {
	r := &Rec{t: t, start: time.Now(), res: Result{
		Suite: suite, Case: name, Mode: mode(), Test: t.Name(),
	}}
	t.Cleanup(r.write)
	return r
}

func mode() string {
	if Soak() {
		return "soak"
	}
	return "short"
}

// Add records a figure, formatted with fmt.Sprintf, and logs it.
func (r *Rec) Add(name, format string, args ...any) {
	v := fmt.Sprintf(format, args...)
	r.mu.Lock()
	r.res.Figures = append(r.res.Figures, Figure{Name: name, Value: v})
	r.mu.Unlock()
	r.t.Logf("%s: %s", name, v)
}

// Fail records why the case failed (the test must still fail itself, for
// example with t.Errorf); the first lines go into the report.
func (r *Rec) Fail(format string, args ...any) {
	r.mu.Lock()
	r.failure = append(r.failure, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

func (r *Rec) write() {
	dir := os.Getenv(OutEnv)
	if dir == "" {
		return
	}
	r.mu.Lock()
	res := r.res
	res.Pass = !r.t.Failed()
	if !res.Pass && len(r.failure) == 0 {
		r.failure = append(r.failure, "the test failed; its log says why")
	}
	res.Failure = strings.Join(r.failure, "; ")
	r.mu.Unlock()
	res.Seconds = time.Since(r.start).Seconds()
	res.Finished = time.Now().UTC().Format(time.RFC3339)
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		r.t.Errorf("relrecord: %v", err)
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		r.t.Errorf("relrecord: %v", err)
		return
	}
	name := unsafeName.ReplaceAllString(res.Suite+"--"+res.Case, "_") + ".json"
	if err := os.WriteFile(filepath.Join(dir, name), append(b, '\n'), 0o644); err != nil {
		r.t.Errorf("relrecord: %v", err)
	}
}
