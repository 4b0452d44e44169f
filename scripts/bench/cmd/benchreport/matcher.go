package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// The matcher's summary (cmd/benchtable) judges every workload row on its
// own and marks a miss with ✗; its targets are stated in one bullet. The
// headline needs one row per target: matcherHeadline reads the bullet for
// the thresholds and the rows for the verdicts, so the thresholds live in
// benchtable alone.

var matcherTargetsRE = regexp.MustCompile(`ns/op ≥ ([\d.]+)× faster than mochi and ≥ ([\d.]+)× faster than nats; ` +
	`at (\d+) subscriptions bytes/sub ≤ 1/([\d.]+) of mochi and ≤ 1/([\d.]+) of nats`)

var goarchHeading = regexp.MustCompile(`^GOARCH=(\S+)`)

// matcherColumn is one judged column of the summary's tables.
type matcherColumn struct {
	header string // the column's header
	text   string // the target, for the headline
	size   string // judged only on rows of this size ("1M"); "" for every row
	allocs bool   // allocations per lookup, which must be 0
}

func matcherColumns(intro []string) []matcherColumn {
	speedMochi, speedNATS, at, memMochi, memNATS := "10", "2", "1M", "15", "6"
	if m := matcherTargetsRE.FindStringSubmatch(strings.Join(intro, " ")); m != nil {
		speedMochi, speedNATS, memMochi, memNATS = m[1], m[2], m[4], m[5]
		if n, err := strconv.ParseFloat(m[3], 64); err == nil {
			at = siLabel(n)
		}
	}
	return []matcherColumn{
		{header: "mochi/fg speed", text: "lookup (ns/op) ≥ " + speedMochi + "× faster than mochi's TopicsIndex, every workload"},
		{header: "nats/fg speed", text: "lookup (ns/op) ≥ " + speedNATS + "× faster than the NATS sublist, every workload"},
		{header: "mochi/fg mem", text: "bytes/sub ≤ 1/" + memMochi + " of mochi's at " + at + " subscriptions", size: at},
		{header: "nats/fg mem", text: "bytes/sub ≤ 1/" + memNATS + " of the NATS sublist's at " + at + " subscriptions", size: at},
		{header: "allocs/op fg / mochi / nats", text: "0 allocations per lookup", allocs: true},
	}
}

// archResult is one column's verdict on one GOARCH's table.
type archResult struct {
	arch          string
	rows, misses  int
	extreme       float64 // the lowest ratio, or the most allocations
	extremeRow    string
	haveExtreme   bool
	missingColumn bool
}

// cellNumber reads "**4.34× ✗**" as 4.34 and "0 / 6 / 0" as 0 (the first
// number); ok is false for "–" and other cells without one.
func cellNumber(cell string) (float64, bool) {
	s := strings.NewReplacer("*", "", "✗", "", "×", "", ",", "").Replace(cell)
	s, _, _ = strings.Cut(strings.TrimSpace(s), " ")
	v, err := strconv.ParseFloat(s, 64)
	return v, err == nil
}

// matcherHeadline returns one target per judged column of the summary,
// its result covering every GOARCH table.
func matcherHeadline(d summaryDoc) []target {
	cols := matcherColumns(d.intro)
	results := make([][]archResult, len(cols))
	for _, p := range sections(d) {
		m := goarchHeading.FindStringSubmatch(p.heading)
		if m == nil {
			continue
		}
		for _, t := range tables(p.lines) {
			for i, c := range cols {
				results[i] = append(results[i], judgeColumn(m[1], t, c))
			}
		}
	}
	var out []target
	for i, c := range cols {
		t := target{text: c.text, verdict: met}
		var parts []string
		for _, r := range results[i] {
			parts = append(parts, r.String(c))
			switch {
			case r.misses > 0:
				t.verdict = missed
			case r.rows == 0 && t.verdict != missed:
				t.verdict = unjudged
			}
		}
		if len(parts) == 0 {
			t.verdict = unjudged
			parts = []string{"no results"}
		}
		t.result = strings.Join(parts, "; ")
		out = append(out, t)
	}
	return out
}

func judgeColumn(arch string, t [][]string, c matcherColumn) archResult {
	r := archResult{arch: arch}
	col := -1
	for i, h := range t[0] {
		if h == c.header {
			col = i
		}
	}
	if col < 0 {
		r.missingColumn = true
		return r
	}
	for _, row := range t[1:] {
		if col >= len(row) || len(row) == 0 {
			continue
		}
		label := row[0]
		if size, _, _ := strings.Cut(label, " "); c.size != "" && size != c.size {
			continue
		}
		v, ok := cellNumber(row[col])
		if !ok {
			continue
		}
		r.rows++
		if judge(row[col]) == missed {
			r.misses++
		}
		worse := v < r.extreme
		if c.allocs {
			worse = v > r.extreme
		}
		if !r.haveExtreme || worse {
			r.extreme, r.extremeRow, r.haveExtreme = v, label, true
		}
	}
	return r
}

func (r archResult) String(c matcherColumn) string {
	switch {
	case r.missingColumn:
		return r.arch + ": no such column"
	case r.rows == 0:
		return r.arch + ": no rows to judge"
	}
	missedText := "none missed"
	if r.misses > 0 {
		missedText = fmt.Sprintf("**%d of %d workloads missed**", r.misses, r.rows)
	}
	if c.allocs {
		if r.extreme == 0 {
			return fmt.Sprintf("%s: 0 in all %d workloads", r.arch, r.rows)
		}
		return fmt.Sprintf("%s: up to %s (%s), %s", r.arch, fmtNum(r.extreme), r.extremeRow, missedText)
	}
	return fmt.Sprintf("%s: lowest %s (%s), %s", r.arch, fmtRatio(r.extreme), r.extremeRow, missedText)
}
