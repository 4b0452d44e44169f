package brokerbench

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// benchPrefix starts every result line; the broker and scenario follow as
// sub-benchmark names.
const benchPrefix = "BenchmarkBroker/"

// Result is one measurement of one scenario against one broker.
type Result struct {
	Broker   string
	Scenario string
	Metrics  []Metric
	Notes    []string // failures during the run; the figures may be off
}

// Metric is one figure of a Result, in Go benchmark units ("msgs/s").
type Metric struct {
	Value float64
	Unit  string
}

func (r *Result) add(v float64, unit string) { r.Metrics = append(r.Metrics, Metric{v, unit}) }

// Write prints r as a Go benchmark line with one iteration, preceded by a
// "# warn" comment line for every note.
func (r Result) Write(w io.Writer) error {
	var b strings.Builder
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "# warn %s/%s: %s\n", r.Broker, r.Scenario, oneLine(n))
	}
	fmt.Fprintf(&b, "%s%s/%s 1", benchPrefix, r.Broker, r.Scenario)
	for _, m := range r.Metrics {
		fmt.Fprintf(&b, " %s %s", formatValue(m.Value), m.Unit)
	}
	b.WriteByte('\n')
	_, err := io.WriteString(w, b.String())
	return err
}

// formatValue keeps about four significant digits: enough for any figure
// here, whose run-to-run noise is larger.
func formatValue(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1000 || a == math.Trunc(a):
		return strconv.FormatFloat(math.Round(v), 'f', -1, 64)
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
