package report

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// ours is the broker the targets are for; the others are its peers.
const ours = "fieldgate"

// brokerOrder fixes the columns; brokers not listed follow in the order seen.
var brokerOrder = []string{ours, "mochi", "mosquitto"}

// maxWarnings bounds the warnings a summary repeats; the raw file has all.
const maxWarnings = 20

// brokerRuns is what the broker, storage and bridge comparisons share:
// the results of cmd/brokerload and cmd/bridgeload, each line named
// Broker/BROKER/SCENARIO, from one or more raw files, with their "# skip"
// and "# warn" lines and their header.
type brokerRuns struct {
	files     []string // raw files read, for the header
	meta      meta
	brokers   []string
	scenarios []string
	values    map[figKey][]float64
	skips     map[string][]string // broker -> reasons, one per skipped run
	warnings  []string
}

type figKey struct{ scenario, broker, unit string }

// newBrokerRuns gathers the results of files.
func newBrokerRuns(files []*rawFile) *brokerRuns {
	s := &brokerRuns{meta: meta{}, values: map[figKey][]float64{}, skips: map[string][]string{}}
	for _, f := range files {
		s.files = append(s.files, f.name)
		for k, v := range f.meta {
			s.meta[k] = append(s.meta[k], v...)
		}
		for _, r := range f.results {
			broker, scenario, ok := strings.Cut(strings.TrimPrefix(r.name, "Broker/"), "/")
			if !ok || !strings.HasPrefix(r.name, "Broker/") {
				continue
			}
			s.addBroker(broker)
			if !slices.Contains(s.scenarios, scenario) {
				s.scenarios = append(s.scenarios, scenario)
			}
			for _, v := range r.values {
				k := figKey{scenario, broker, v.unit}
				s.values[k] = append(s.values[k], v.v)
			}
		}
		for _, sk := range f.skips {
			s.addBroker(sk.who)
			s.skips[sk.who] = append(s.skips[sk.who], sk.why)
		}
		s.warnings = append(s.warnings, f.warnings...)
	}
	return s
}

func (s *brokerRuns) addBroker(b string) {
	if slices.Contains(s.brokers, b) {
		return
	}
	s.brokers = append(s.brokers, b)
	rank := func(b string) int {
		if i := slices.Index(brokerOrder, b); i >= 0 {
			return i
		}
		return len(brokerOrder)
	}
	slices.SortStableFunc(s.brokers, func(a, b string) int { return rank(a) - rank(b) })
}

// fig is the median of one scenario, broker and unit.
type fig struct {
	v  float64
	n  int  // runs
	ok bool // false: not measured
}

func (s *brokerRuns) get(scenario, broker, unit string) fig {
	vs := s.values[figKey{scenario, broker, unit}]
	v, ok := median(vs)
	return fig{v, len(vs), ok}
}

// ran reports whether broker has any result for scenario.
func (s *brokerRuns) ran(scenario, broker string) bool {
	for k := range s.values {
		if k.scenario == scenario && k.broker == broker {
			return true
		}
	}
	return false
}

// peers are the brokers other than ours, in column order.
func (s *brokerRuns) peers() []string {
	return slices.DeleteFunc(slices.Clone(s.brokers), func(b string) bool { return b == ours })
}

func (s *brokerRuns) scenariosWith(prefix string) []string {
	var out []string
	for _, sc := range s.scenarios {
		if strings.HasPrefix(sc, prefix) {
			out = append(out, sc)
		}
	}
	return out
}

// setting is one KEY=VALUE of the settings line.
func (s *brokerRuns) setting(key string) string {
	for f := range strings.FieldsSeq(s.meta.get("settings")) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}

// writeHeader writes the list describing the run: the machine, with how
// the brokers share it (sharing), then items, then the settings, load
// average and raw files from the raw output's header, then more.
func (s *brokerRuns) writeHeader(w *markdown, sharing string, items []string, more ...string) {
	m := s.meta
	machine := orUnknown(m.get("cpu"))
	if m.get("cores") != "" {
		machine += ", " + m.get("cores") + " cores"
	}
	if m.get("goos") != "" {
		machine += ", " + m.get("goos") + "/" + m.get("goarch")
	}
	list := []string{fmt.Sprintf("Machine: %s. The brokers and the load generator share it, %s.", machine, sharing)}
	list = append(list, items...)
	if m.get("settings") != "" {
		list = append(list, "Settings: "+m.get("settings"))
	}
	if m.get("loadavg-start") != "" {
		list = append(list, fmt.Sprintf("Load average (1, 5, 15 min) at start: %s; at end: %s. Other work on the machine skews the figures.",
			m.get("loadavg-start"), orUnknown(m.get("loadavg-end"))))
	}
	if len(s.files) > 0 {
		list = append(list, fmt.Sprintf("Raw output: `%s`. Every figure is the median of its runs.", strings.Join(s.files, "`, `")))
	}
	w.list(append(list, more...)...)
}

// notMeasured explains why broker has no figure for a target.
func (s *brokerRuns) notMeasured(scenarios []string, broker string) string {
	if len(scenarios) == 0 {
		return "not measured: no such scenario ran"
	}
	if r := s.skips[broker]; len(r) > 0 {
		return fmt.Sprintf("not measured: %s skipped (%s)", broker, r[0])
	}
	return fmt.Sprintf("not measured: no %s result", broker)
}

// ratioTarget checks every scenario's ratio against least: ours ÷ peer
// when higherIsBetter, else peer ÷ ours.
func (s *brokerRuns) ratioTarget(name string, scenarios []string, peer, unit string, higherIsBetter bool, least float64) verdict {
	var fails, passes []string
	worst, worstAt := math.Inf(1), ""
	for _, sc := range scenarios {
		r, ok := s.ratio(sc, peer, unit, higherIsBetter)
		if !ok {
			continue
		}
		txt := fmt.Sprintf("%s %s", sc, ratio(r))
		if r < least {
			fails = append(fails, txt)
		} else {
			passes = append(passes, txt)
		}
		if r < worst {
			worst, worstAt = r, sc
		}
	}
	switch {
	case len(fails) > 0:
		return judged(name, false, strings.Join(fails, ", "))
	case len(passes) > 0:
		return judged(name, true, fmt.Sprintf("lowest %s (%s)", ratio(worst), worstAt))
	case !s.anyRan(scenarios, ours):
		return notJudged(name, s.notMeasured(scenarios, ours))
	}
	return notJudged(name, s.notMeasured(scenarios, peer))
}

// limitTarget checks that fieldgate's figure stays at or below most in
// every scenario.
func (s *brokerRuns) limitTarget(name string, scenarios []string, unit string, most float64) verdict {
	var fails, passes []string
	for _, sc := range scenarios {
		f := s.get(sc, ours, unit)
		if !f.ok {
			continue
		}
		txt := fmt.Sprintf("%s %s B", sc, figure(f.v))
		if f.v > most {
			fails = append(fails, txt)
		} else {
			passes = append(passes, txt)
		}
	}
	switch {
	case len(fails) > 0:
		return judged(name, false, strings.Join(fails, ", "))
	case len(passes) > 0:
		return judged(name, true, strings.Join(passes, ", "))
	}
	return notJudged(name, s.notMeasured(scenarios, ours))
}

func (s *brokerRuns) anyRan(scenarios []string, broker string) bool {
	return slices.ContainsFunc(scenarios, func(sc string) bool { return s.ran(sc, broker) })
}

// ratio is ours ÷ peer when higherIsBetter, else peer ÷ ours.
func (s *brokerRuns) ratio(scenario, peer, unit string, higherIsBetter bool) (float64, bool) {
	o, p := s.get(scenario, ours, unit), s.get(scenario, peer, unit)
	if !o.ok || !p.ok {
		return 0, false
	}
	num, den := p.v, o.v
	if higherIsBetter {
		num, den = o.v, p.v
	}
	if den <= 0 {
		return 0, false
	}
	return num / den, true
}

// value formats one broker's figure with format: "–" when the broker did
// not run the scenario, "n/a" when it ran but has no such figure (a heap
// it does not publish).
func (s *brokerRuns) value(scenario, broker, unit string, format func(float64) string) string {
	f := s.get(scenario, broker, unit)
	switch {
	case f.ok:
		return format(f.v)
	case s.ran(scenario, broker):
		return "n/a"
	}
	return "–"
}

func (s *brokerRuns) ratioCell(scenario, peer, unit string, higherIsBetter bool) string {
	r, ok := s.ratio(scenario, peer, unit, higherIsBetter)
	if !ok {
		return "–"
	}
	return ratio(r)
}

// runList is every run's value of one figure, in run order.
func (s *brokerRuns) runList(scenario, broker, unit string, format func(float64) string) string {
	vs := s.values[figKey{scenario, broker, unit}]
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = format(v)
	}
	return strings.Join(out, ", ")
}

// head returns the header of a table whose first columns are lead, then
// one column per broker and, unless ratioFmt is empty, one ratio column per
// peer, and its alignment.
func (s *brokerRuns) head(ratioFmt string, lead ...string) (string, []string) {
	cols := slices.Clone(lead)
	cols = append(cols, s.brokers...)
	if ratioFmt != "" {
		for _, p := range s.peers() {
			cols = append(cols, fmt.Sprintf(ratioFmt, p))
		}
	}
	return strings.Repeat("l", len(lead)), cols
}

// row returns one table row: lead cells, each broker's figure and, unless
// ratios is false, the ratios against the peers.
func (s *brokerRuns) row(scenario, unit string, ratios, higherIsBetter bool, lead ...string) []string {
	cells := slices.Clone(lead)
	for _, br := range s.brokers {
		cells = append(cells, s.value(scenario, br, unit, figure))
	}
	if ratios {
		for _, p := range s.peers() {
			cells = append(cells, s.ratioCell(scenario, p, unit, higherIsBetter))
		}
	}
	return cells
}

// scenarioTable writes a table of a rate in unit: a row per scenario, a
// column per broker and, unless ratioFmt is empty, a column per peer of
// the ratio fieldgate ÷ peer, headed as ratioFmt says.
func (s *brokerRuns) scenarioTable(w *markdown, scenarios []string, unit, ratioFmt string) {
	var rows [][]string
	for _, sc := range scenarios {
		rows = append(rows, s.row(sc, unit, ratioFmt != "", true, "`"+sc+"`"))
	}
	align, head := s.head(ratioFmt, "scenario")
	w.table(align, head, rows...)
}

// writeProblems lists the skipped runs and the warnings.
func (s *brokerRuns) writeProblems(w *markdown) {
	if len(s.skips) == 0 && len(s.warnings) == 0 {
		return
	}
	w.heading(2, "Skipped runs and warnings")
	var items []string
	for _, br := range s.brokers {
		if r := s.skips[br]; len(r) > 0 {
			items = append(items, fmt.Sprintf("%s skipped in %d run(s): %s", br, len(r), r[0]))
		}
	}
	for i, warn := range s.warnings {
		if i == maxWarnings {
			items = append(items, fmt.Sprintf("... and %d more warnings in the raw output", len(s.warnings)-maxWarnings))
			break
		}
		items = append(items, warn)
	}
	w.list(items...)
}
