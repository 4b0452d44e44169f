package report

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// summary is one comparison's results, read and judged: written alone as
// results/NAME-summary.md, and as a section of the report.
type summary interface {
	title() string
	// intro writes what comes before the first section: the list that
	// describes the run.
	intro(w *markdown)
	// body writes the sections, their headings at level 2.
	body(w *markdown)
	// targets are the comparison's targets judged, for the report's
	// headline; the body shows them too.
	targets() []verdict
}

// comparison is one side-by-side benchmark: the script that runs it, the
// stem of its results files and how its raw output is summarized.
type comparison struct {
	name   string // matcher, broker, storage, bridge, footprint or idle
	script string
	// perArch: one raw file per GOARCH (results/NAME-ARCH.txt), all in
	// the summary; otherwise the report takes the host's alone.
	perArch bool
	// single: the summary reads one raw file, not several.
	single bool
	read   func(files []*rawFile, record meta) summary
}

// Parts are the names of the comparisons, in the report's order.
var Parts = []string{"matcher", "broker", "storage", "bridge", "footprint", "idle"}

var comparisons = []comparison{
	{name: "matcher", script: "bench-matcher.sh", perArch: true, read: func(fs []*rawFile, record meta) summary {
		return newMatcherSummary(fs, record)
	}},
	{name: "broker", script: "bench-broker.sh", read: func(fs []*rawFile, _ meta) summary {
		return brokerSummary{newBrokerRuns(fs)}
	}},
	{name: "storage", script: "bench-storage.sh", read: func(fs []*rawFile, _ meta) summary {
		return storageSummary{newBrokerRuns(fs)}
	}},
	{name: "bridge", script: "bench-bridge.sh", read: func(fs []*rawFile, _ meta) summary {
		return bridgeSummary{newBrokerRuns(fs)}
	}},
	{name: "footprint", script: "bench-footprint.sh", single: true, read: func(fs []*rawFile, _ meta) summary {
		return newFootprintSummary(fs[0])
	}},
	{name: "idle", script: "bench-idle.sh", single: true, read: func(fs []*rawFile, _ meta) summary {
		return newIdleSummary(fs[0])
	}},
}

func comparisonNamed(name string) (comparison, error) {
	i := slices.IndexFunc(comparisons, func(c comparison) bool { return c.name == name })
	if i < 0 {
		return comparison{}, fmt.Errorf("report: no comparison %q (%s)", name, strings.Join(Parts, ", "))
	}
	return comparisons[i], nil
}

// WriteSummary writes the Markdown summary of comparison part (one of
// Parts) from the raw files at paths, as its script made them, to w.
func WriteSummary(w io.Writer, part string, paths []string) error {
	c, err := comparisonNamed(part)
	if err != nil {
		return err
	}
	if len(paths) == 0 {
		return fmt.Errorf("report: the %s summary needs a raw file", part)
	}
	if c.single && len(paths) > 1 {
		return fmt.Errorf("report: the %s summary takes one raw file, not %d", part, len(paths))
	}
	files, err := readAll(paths)
	if err != nil {
		return err
	}
	_, err = io.WriteString(w, render(c.read(files, nil)))
	return err
}

// render returns s as a Markdown document of its own.
func render(s summary) string {
	var md markdown
	md.heading(1, s.title())
	s.intro(&md)
	s.body(&md)
	return md.document()
}
