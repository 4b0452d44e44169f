package report

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// curves holds, for the benchmarks whose name a pattern matches, the
// medians of every unit by implementation and by count (of subscriptions
// or connections): one curve per implementation.
type curves struct {
	impls  []string // in implOrder
	counts []float64
	by     map[string]map[float64]map[string]float64 // impl -> count -> unit -> median
}

// implOrder fixes the order of lines and columns; others follow by name.
var implOrder = []string{ours, mochi, "mosquitto", nats}

// collect gathers the curves of s from the benchmarks re matches; re has
// two groups: the implementation and the count.
func collect(s *samples, re *regexp.Regexp) curves {
	c := curves{by: map[string]map[float64]map[string]float64{}}
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
			c.by[impl] = map[float64]map[string]float64{}
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
	rank := func(impl string) int {
		if i := slices.Index(implOrder, impl); i >= 0 {
			return i
		}
		return len(implOrder)
	}
	slices.SortFunc(c.impls, func(a, b string) int {
		if ra, rb := rank(a), rank(b); ra != rb {
			return ra - rb
		}
		return strings.Compare(a, b)
	})
	return c
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

// curvePlot is one line per implementation of c's medians in unit.
func curvePlot(c curves, unit, title, xlabel, ylabel string, logY bool) Plot {
	p := Plot{Title: title, XLabel: xlabel, YLabel: ylabel, LogY: logY}
	for _, impl := range c.impls {
		p.Series = append(p.Series, Series{Name: impl, Points: c.points(impl, unit)})
	}
	return p
}

// writeCurveTable writes c's medians in unit, one row per count, with the
// ratios to fieldgate: peer ÷ fieldgate for figures where lower is
// better, fieldgate ÷ peer where higher is, so that above 1 is fieldgate's.
func writeCurveTable(w *markdown, c curves, counted, unit, what string, higherBetter bool) {
	if len(c.counts) == 0 {
		return
	}
	peers := slices.DeleteFunc(slices.Clone(c.impls), func(s string) bool { return s == ours })
	withOurs := slices.Contains(c.impls, ours)
	head := append([]string{counted}, c.impls...)
	if withOurs {
		for _, p := range peers {
			if higherBetter {
				head = append(head, ours+" ÷ "+p)
			} else {
				head = append(head, p+" ÷ "+ours)
			}
		}
	}
	var rows [][]string
	for _, n := range c.counts {
		row := []string{number(n)}
		for _, impl := range c.impls {
			if v, ok := c.value(impl, n, unit); ok {
				row = append(row, number(v))
			} else {
				row = append(row, "–")
			}
		}
		if withOurs {
			fg, okF := c.value(ours, n, unit)
			for _, p := range peers {
				v, okP := c.value(p, n, unit)
				switch {
				case !okF || !okP || fg <= 0 || v <= 0:
					row = append(row, "–")
				case higherBetter:
					row = append(row, ratio(fg/v))
				default:
					row = append(row, ratio(v/fg))
				}
			}
		}
		rows = append(rows, row)
	}
	w.para(fmt.Sprintf("%s:", strings.ToUpper(what[:1])+what[1:]))
	w.table("", head, rows...)
}
