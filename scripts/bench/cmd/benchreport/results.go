package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// benchSet holds the figures of Go benchmark result lines, such as
// "BenchmarkBroker/fieldgate/idle-1000conns-5subs 1 12068 rss-B/conn",
// every sample of every repetition kept.
type benchSet struct {
	names []string                        // benchmark names, first seen first
	vals  map[string]map[string][]float64 // name -> unit -> samples
}

func newBenchSet() *benchSet {
	return &benchSet{vals: map[string]map[string][]float64{}}
}

// read adds the result lines of r, named name in errors; comments,
// headers and other lines are skipped.
func (s *benchSet) read(name string, r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		if _, err := strconv.ParseInt(f[1], 10, 64); err != nil {
			continue // not a result line: no iteration count
		}
		units := s.vals[f[0]]
		if units == nil {
			units = map[string][]float64{}
			s.vals[f[0]] = units
			s.names = append(s.names, f[0])
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return fmt.Errorf("%s:%d: %q is not a number (unit %s)", name, line, f[i], f[i+1])
			}
			units[f[i+1]] = append(units[f[i+1]], v)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// readFile adds the result lines of the file at path.
func (s *benchSet) readFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return s.read(path, f)
}

// median returns the median of the samples of name in unit.
func (s *benchSet) median(name, unit string) (float64, bool) {
	return median(s.vals[name][unit])
}

// median of xs; ok is false when xs is empty.
func median(xs []float64) (float64, bool) {
	if len(xs) == 0 {
		return 0, false
	}
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2], true
	}
	return (s[n/2-1] + s[n/2]) / 2, true
}

// series is one implementation's medians against a count (subscriptions
// or connections): count -> unit -> median.
type series map[float64]map[string]float64

// curves collects, from the benchmarks whose name re matches, the medians
// of every unit by implementation and count. re has two groups: the
// implementation and the count.
type curves struct {
	impls  []string // in implOrder
	counts []float64
	by     map[string]series
}

// implOrder fixes the order of lines and columns; others follow by name.
var implOrder = []string{"fieldgate", "mochi", "mosquitto", "nats"}

func collect(s *benchSet, re *regexp.Regexp) curves {
	c := curves{by: map[string]series{}}
	for _, name := range s.names {
		m := re.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		n, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			continue
		}
		impl := m[1]
		if c.by[impl] == nil {
			c.by[impl] = series{}
			c.impls = append(c.impls, impl)
		}
		if c.by[impl][n] == nil {
			c.by[impl][n] = map[string]float64{}
		}
		if !slices.Contains(c.counts, n) {
			c.counts = append(c.counts, n)
		}
		for unit := range s.vals[name] {
			if v, ok := s.median(name, unit); ok {
				c.by[impl][n][unit] = v
			}
		}
	}
	slices.Sort(c.counts)
	slices.SortFunc(c.impls, func(a, b string) int {
		ia, ib := rank(a), rank(b)
		if ia != ib {
			return ia - ib
		}
		return strings.Compare(a, b)
	})
	return c
}

func rank(impl string) int {
	if i := slices.Index(implOrder, impl); i >= 0 {
		return i
	}
	return len(implOrder)
}

// points returns impl's (count, median) pairs in unit, by count.
func (c curves) points(impl, unit string) []Point {
	var pts []Point
	for _, n := range c.counts {
		if v, ok := c.by[impl][n][unit]; ok {
			pts = append(pts, Point{n, v})
		}
	}
	return pts
}

// value returns impl's median in unit at count n.
func (c curves) value(impl string, n float64, unit string) (float64, bool) {
	v, ok := c.by[impl][n][unit]
	return v, ok
}

// meta holds the "key: value" lines of a file, such as bench-all.sh's
// record of the machine and of each part; a key may repeat.
type meta map[string][]string

var metaRE = regexp.MustCompile(`^([a-z][a-z0-9-]*): (.*)$`)

func readMeta(r io.Reader) (meta, error) {
	m := meta{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if g := metaRE.FindStringSubmatch(strings.TrimSpace(sc.Text())); g != nil {
			m[g[1]] = append(m[g[1]], strings.TrimSpace(g[2]))
		}
	}
	return m, sc.Err()
}

// get returns the first value of key, or "".
func (m meta) get(key string) string {
	if v := m[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// summaryDoc is a Markdown summary of one comparison (results/*-summary.md)
// split for embedding: its title (a first line that is a level-1 or
// level-2 heading), what comes before its first section, and its sections,
// whose headings are one level below the title's.
type summaryDoc struct {
	title string
	level int // heading level of the sections
	intro []string
	body  []string
}

func parseSummary(text string) summaryDoc {
	d := summaryDoc{level: 2}
	lines := trimBlank(strings.Split(text, "\n"))
	if len(lines) > 0 {
		if n := headingLevel(lines[0]); n == 1 || n == 2 {
			d.title = strings.TrimSpace(lines[0][n:])
			d.level = n + 1
			lines = lines[1:]
		}
	}
	fenced := false
	for _, line := range lines {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		if len(d.body) == 0 && (fenced || headingLevel(line) != d.level) {
			d.intro = append(d.intro, line)
		} else {
			d.body = append(d.body, line)
		}
	}
	d.intro = trimBlank(d.intro)
	d.body = trimBlank(d.body)
	return d
}

// headingLevel returns the level of an ATX heading line ("## A" is 2), or
// 0 for any other line.
func headingLevel(line string) int {
	n := len(line) - len(strings.TrimLeft(line, "#"))
	if n == 0 || n > 6 || n == len(line) || line[n] != ' ' {
		return 0
	}
	return n
}

func trimBlank(lines []string) []string {
	for len(lines) > 0 && strings.TrimSpace(lines[0]) == "" {
		lines = lines[1:]
	}
	for len(lines) > 0 && strings.TrimSpace(lines[len(lines)-1]) == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// shiftHeadings returns lines with every ATX heading outside fenced code
// blocks moved by levels ("## A" becomes "### A" for 1), at most to 6.
func shiftHeadings(lines []string, levels int) []string {
	out := make([]string, 0, len(lines))
	fenced := false
	for _, line := range lines {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		if n := headingLevel(line); n > 0 && !fenced {
			line = strings.Repeat("#", max(1, min(n+levels, 6))) + line[n:]
		}
		out = append(out, line)
	}
	return out
}

// verdict is whether a target was met.
type verdict int

const (
	unjudged verdict = iota
	met
	missed
)

func (v verdict) String() string {
	switch v {
	case met:
		return "✓ met"
	case missed:
		return "**✗ missed**"
	}
	return "not judged"
}

// target is one row of a headline table.
type target struct {
	text    string // what must hold
	result  string // what was measured
	verdict verdict
}

// judge reads a verdict from a result cell of the summaries: ✗ is a miss,
// ✓ is met, anything else is not judged.
func judge(cell string) verdict {
	switch {
	case strings.Contains(cell, "✗"):
		return missed
	case strings.Contains(cell, "✓"):
		return met
	}
	return unjudged
}

// unmark strips a result cell of the emphasis and the ✓ or ✗ that the
// verdict column repeats: "**✗ 0.70× (...)**" becomes "0.70× (...)".
func unmark(cell string) string {
	s := strings.TrimSpace(cell)
	if len(s) > 4 && strings.HasPrefix(s, "**") && strings.HasSuffix(s, "**") {
		s = s[2 : len(s)-2]
	}
	s = strings.TrimPrefix(strings.TrimPrefix(s, "✓"), "✗")
	return strings.TrimSpace(s)
}

// tableCells splits a Markdown table row into its trimmed cells; ok is
// false for lines that are not table rows.
func tableCells(line string) (cells []string, ok bool) {
	line = strings.TrimSpace(line)
	if !strings.HasPrefix(line, "|") || !strings.HasSuffix(line, "|") || len(line) < 2 {
		return nil, false
	}
	for c := range strings.SplitSeq(line[1:len(line)-1], "|") {
		cells = append(cells, strings.TrimSpace(c))
	}
	return cells, true
}

func isSeparator(cells []string) bool {
	for _, c := range cells {
		if strings.Trim(c, ":-") != "" || c == "" {
			return false
		}
	}
	return len(cells) > 0
}

// tables returns the Markdown tables of lines, each without its header
// separator: the first row of each is its header.
func tables(lines []string) [][][]string {
	var out [][][]string
	var cur [][]string
	for _, line := range lines {
		cells, ok := tableCells(line)
		if !ok {
			if cur != nil {
				out = append(out, cur)
				cur = nil
			}
			continue
		}
		if !isSeparator(cells) {
			cur = append(cur, cells)
		}
	}
	if cur != nil {
		out = append(out, cur)
	}
	return out
}

// part is one section of a summary: its heading text and lines.
type part struct {
	heading string
	lines   []string
}

// sections splits the body of d at its section headings; lines before the
// first are left out.
func sections(d summaryDoc) []part {
	var out []part
	fenced := false
	for _, line := range d.body {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		if !fenced && headingLevel(line) == d.level {
			out = append(out, part{heading: strings.TrimSpace(line[d.level:])})
			continue
		}
		if len(out) > 0 {
			out[len(out)-1].lines = append(out[len(out)-1].lines, line)
		}
	}
	return out
}

// section returns the lines of the sections of d whose heading matches
// re, without the headings.
func section(d summaryDoc, re *regexp.Regexp) []string {
	var out []string
	for _, p := range sections(d) {
		if re.MatchString(p.heading) {
			out = append(out, p.lines...)
		}
	}
	return out
}

var targetsHeading = regexp.MustCompile(`^Targets?\b`)

// targets returns the rows of the tables in the summary's "Target" or
// "Targets" section: what must hold and what was measured.
func targets(d summaryDoc) []target {
	var out []target
	for _, t := range tables(section(d, targetsHeading)) {
		for _, row := range t[1:] {
			if len(row) < 2 {
				continue
			}
			out = append(out, target{text: row[0], result: unmark(row[1]), verdict: judge(row[1])})
		}
	}
	return out
}
