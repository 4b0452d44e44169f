package brokerbench

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// ours is the broker the targets are for; the others are its peers.
const ours = "fieldgate"

// Targets for fieldgate's broker. Throughput must hold in every throughput
// scenario; the idle-connection figures are RSS per connection.
const (
	minThroughputVsMochi     = 1.5      // fieldgate msgs/s ÷ mochi msgs/s
	minThroughputVsMosquitto = 1.0      // fieldgate msgs/s ÷ Mosquitto msgs/s
	minIdleRSSVsMochi        = 4.0      // mochi B/conn ÷ fieldgate B/conn
	maxIdleRSS               = 16 << 10 // fieldgate B/conn: a Pi Zero holds thousands of devices in a few tens of MB
)

// brokerOrder fixes the columns; brokers not listed follow in the order seen.
var brokerOrder = []string{ours, "mochi", "mosquitto"}

// maxWarnings bounds the warnings the summary repeats; the raw file has all.
const maxWarnings = 20

var (
	metaRE = regexp.MustCompile(`^([a-z][a-z0-9-]*): (.*)$`)
	skipRE = regexp.MustCompile(`^# skip ([^:]+): (.*)$`)
	warnRE = regexp.MustCompile(`^# warn (.*)$`)
)

// Summary collects the raw output of brokerload runs (Read) and renders it
// as Markdown (WriteMarkdown): medians per scenario and broker, ratios
// against fieldgate, and the targets.
type Summary struct {
	Files []string // raw files read, for the header

	meta      map[string]string
	brokers   []string
	scenarios []string
	values    map[cell][]float64
	skips     map[string][]string // broker -> reasons, one per skipped run
	warnings  []string
}

type cell struct{ scenario, broker, unit string }

// NewSummary returns an empty Summary.
func NewSummary() *Summary {
	return &Summary{meta: map[string]string{}, values: map[cell][]float64{}, skips: map[string][]string{}}
}

// Read adds the lines of one raw output: "key: value" header lines, result
// lines, and "# skip" and "# warn" comments. Other lines are ignored.
func (s *Summary) Read(name string, r io.Reader) error {
	s.Files = append(s.Files, name)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(text, benchPrefix):
			if err := s.addResult(text); err != nil {
				return fmt.Errorf("%s:%d: %w", name, line, err)
			}
		case skipRE.MatchString(text):
			m := skipRE.FindStringSubmatch(text)
			s.addBroker(m[1])
			s.skips[m[1]] = append(s.skips[m[1]], m[2])
		case warnRE.MatchString(text):
			s.warnings = append(s.warnings, warnRE.FindStringSubmatch(text)[1])
		case metaRE.MatchString(text):
			m := metaRE.FindStringSubmatch(text)
			s.meta[m[1]] = m[2]
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// addResult parses "BenchmarkBroker/BROKER/SCENARIO N v unit v unit ...".
func (s *Summary) addResult(line string) error {
	f := strings.Fields(line)
	broker, scenario, ok := strings.Cut(strings.TrimPrefix(f[0], benchPrefix), "/")
	if !ok || len(f) < 2 || len(f)%2 != 0 {
		return fmt.Errorf("malformed result line %q", line)
	}
	s.addBroker(broker)
	if !slices.Contains(s.scenarios, scenario) {
		s.scenarios = append(s.scenarios, scenario)
	}
	for i := 2; i+1 < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return fmt.Errorf("value %q in %q: %w", f[i], line, err)
		}
		k := cell{scenario, broker, f[i+1]}
		s.values[k] = append(s.values[k], v)
	}
	return nil
}

func (s *Summary) addBroker(b string) {
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

// figure is the median of one scenario, broker and unit.
type figure struct {
	v  float64
	n  int  // runs
	ok bool // false: not measured
}

func (s *Summary) get(scenario, broker, unit string) figure {
	vs := s.values[cell{scenario, broker, unit}]
	if len(vs) == 0 {
		return figure{}
	}
	return figure{median(vs), len(vs), true}
}

// ran reports whether broker has any result for scenario.
func (s *Summary) ran(scenario, broker string) bool {
	for k := range s.values {
		if k.scenario == scenario && k.broker == broker {
			return true
		}
	}
	return false
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// peers are the brokers other than ours, in column order.
func (s *Summary) peers() []string {
	return slices.DeleteFunc(slices.Clone(s.brokers), func(b string) bool { return b == ours })
}

func (s *Summary) scenariosWith(prefix string) []string {
	var out []string
	for _, sc := range s.scenarios {
		if strings.HasPrefix(sc, prefix) {
			out = append(out, sc)
		}
	}
	return out
}

// WriteMarkdown renders the summary.
func (s *Summary) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	s.header(&b)
	s.targets(&b)
	s.throughputTable(&b)
	s.latencyTable(&b)
	s.memoryTable(&b)
	s.problems(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

func (s *Summary) header(b *strings.Builder) {
	m := s.meta
	s.writeHeader(b, "MQTT broker: fieldgate vs mochi-mqtt vs Mosquitto", "one broker at a time",
		fmt.Sprintf("Go: %s", orUnknown(m["go"])),
		fmt.Sprintf("fieldgate: %s", orUnknown(m["fieldgate"])),
		fmt.Sprintf("mochi-mqtt: %s (its full `Server`: default options and capabilities, allow-all auth, one TCP listener)", orUnknown(m["mochi"])),
		fmt.Sprintf("Mosquitto: %s", orUnknown(m["mosquitto"])),
	)
	fmt.Fprintln(b, "- Ratios: throughput is fieldgate ÷ peer; latency and memory are peer ÷ fieldgate. "+
		"Either way a ratio above 1 means fieldgate is better.")
	fmt.Fprintln(b)
}

// writeHeader writes the title and the list describing the run: the
// machine, with how the brokers share it (sharing), then items, then the
// settings, load average and raw files from the raw output's header. It
// leaves the list open for the caller to add to and end.
func (s *Summary) writeHeader(b *strings.Builder, title, sharing string, items ...string) {
	m := s.meta
	fmt.Fprintln(b, "# "+title)
	fmt.Fprintln(b)
	machine := orUnknown(m["cpu"])
	if m["cores"] != "" {
		machine += ", " + m["cores"] + " cores"
	}
	if m["goos"] != "" {
		machine += ", " + m["goos"] + "/" + m["goarch"]
	}
	fmt.Fprintf(b, "- Machine: %s. The brokers and the load generator share it, %s.\n", machine, sharing)
	for _, item := range items {
		fmt.Fprintf(b, "- %s\n", item)
	}
	if m["settings"] != "" {
		fmt.Fprintf(b, "- Settings: %s\n", m["settings"])
	}
	if m["loadavg-start"] != "" {
		fmt.Fprintf(b, "- Load average (1, 5, 15 min) at start: %s; at end: %s. Other work on the machine skews the figures.\n",
			m["loadavg-start"], orUnknown(m["loadavg-end"]))
	}
	if len(s.Files) > 0 {
		fmt.Fprintf(b, "- Raw output: `%s`. Every figure is the median of its runs.\n", strings.Join(s.Files, "`, `"))
	}
}

// verdict is the outcome of one target.
type verdict struct {
	name   string
	result string
}

func (s *Summary) targets(b *strings.Builder) {
	var vs []verdict
	tp := s.scenariosWith("qos")
	vs = append(vs,
		s.ratioTarget(fmt.Sprintf("throughput ≥ %s× mochi, every throughput scenario", fmtConst(minThroughputVsMochi)),
			tp, "mochi", "msgs/s", true, minThroughputVsMochi),
		s.ratioTarget(fmt.Sprintf("throughput ≥ %s× Mosquitto, every throughput scenario", fmtConst(minThroughputVsMosquitto)),
			tp, "mosquitto", "msgs/s", true, minThroughputVsMosquitto),
	)
	idle := s.scenariosWith("idle-")
	vs = append(vs,
		s.ratioTarget(fmt.Sprintf("RSS per idle connection ≤ 1/%s of mochi's", fmtConst(minIdleRSSVsMochi)),
			idle, "mochi", "rss-B/conn", false, minIdleRSSVsMochi),
		s.limitTarget(fmt.Sprintf("RSS per idle connection ≤ %d KiB", maxIdleRSS>>10), idle, "rss-B/conn", maxIdleRSS),
	)
	section(b, "Targets", "")
	fmt.Fprintln(b, "| target | result |")
	fmt.Fprintln(b, "|---|---|")
	for _, v := range vs {
		fmt.Fprintf(b, "| %s | %s |\n", v.name, v.result)
	}
	fmt.Fprintln(b)
}

// notMeasured explains why fieldgate (or peer) has no figure for a target.
func (s *Summary) notMeasured(scenarios []string, broker string) string {
	if len(scenarios) == 0 {
		return "not measured: no such scenario ran"
	}
	if r := s.skips[broker]; len(r) > 0 {
		return fmt.Sprintf("not measured: %s skipped (%s)", broker, r[0])
	}
	return fmt.Sprintf("not measured: no %s result", broker)
}

// ratioTarget checks every scenario's ratio against min: ours ÷ peer when
// higherIsBetter, else peer ÷ ours.
func (s *Summary) ratioTarget(name string, scenarios []string, peer, unit string, higherIsBetter bool, min float64) verdict {
	var fails, passes []string
	worst, worstAt := math.Inf(1), ""
	for _, sc := range scenarios {
		r, ok := s.ratio(sc, peer, unit, higherIsBetter)
		if !ok {
			continue
		}
		txt := fmt.Sprintf("%s %s", sc, fmtRatio(r))
		if r < min {
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
		return verdict{name, "**✗ " + strings.Join(fails, ", ") + "**"}
	case len(passes) > 0:
		return verdict{name, fmt.Sprintf("✓ lowest %s (%s)", fmtRatio(worst), worstAt)}
	case !s.anyRan(scenarios, ours):
		return verdict{name, s.notMeasured(scenarios, ours)}
	}
	return verdict{name, s.notMeasured(scenarios, peer)}
}

// limitTarget checks that fieldgate's figure stays at or below max in every scenario.
func (s *Summary) limitTarget(name string, scenarios []string, unit string, max float64) verdict {
	var fails, passes []string
	for _, sc := range scenarios {
		f := s.get(sc, ours, unit)
		if !f.ok {
			continue
		}
		txt := fmt.Sprintf("%s %s B", sc, fmtNum(f.v))
		if f.v > max {
			fails = append(fails, txt)
		} else {
			passes = append(passes, txt)
		}
	}
	switch {
	case len(fails) > 0:
		return verdict{name, "**✗ " + strings.Join(fails, ", ") + "**"}
	case len(passes) > 0:
		return verdict{name, "✓ " + strings.Join(passes, ", ")}
	}
	return verdict{name, s.notMeasured(scenarios, ours)}
}

func (s *Summary) anyRan(scenarios []string, broker string) bool {
	return slices.ContainsFunc(scenarios, func(sc string) bool { return s.ran(sc, broker) })
}

// ratio is ours ÷ peer when higherIsBetter, else peer ÷ ours.
func (s *Summary) ratio(scenario, peer, unit string, higherIsBetter bool) (float64, bool) {
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

// value formats one broker's figure: "–" when the broker did not run the
// scenario, "n/a" when it ran but has no such figure (a heap it does not publish).
func (s *Summary) value(scenario, broker, unit string) string {
	f := s.get(scenario, broker, unit)
	switch {
	case f.ok:
		return fmtNum(f.v)
	case s.ran(scenario, broker):
		return "n/a"
	}
	return "–"
}

func (s *Summary) ratioCell(scenario, peer, unit string, higherIsBetter bool) string {
	r, ok := s.ratio(scenario, peer, unit, higherIsBetter)
	if !ok {
		return "–"
	}
	return fmtRatio(r)
}

// tableHead writes the header of a table whose first columns are lead,
// then one column per broker and, unless ratioFmt is empty, one ratio
// column per peer.
func (s *Summary) tableHead(b *strings.Builder, ratioFmt string, lead ...string) {
	cols := slices.Clone(lead)
	cols = append(cols, s.brokers...)
	if ratioFmt != "" {
		for _, p := range s.peers() {
			cols = append(cols, fmt.Sprintf(ratioFmt, p))
		}
	}
	fmt.Fprintf(b, "| %s |\n|", strings.Join(cols, " | "))
	for i := range cols {
		if i < len(lead) {
			b.WriteString("---|")
		} else {
			b.WriteString("--:|")
		}
	}
	b.WriteByte('\n')
}

// row writes one table row: lead cells, each broker's figure and, unless
// ratios is false, the ratios against the peers.
func (s *Summary) row(b *strings.Builder, scenario, unit string, ratios, higherIsBetter bool, lead ...string) {
	cells := slices.Clone(lead)
	for _, br := range s.brokers {
		cells = append(cells, s.value(scenario, br, unit))
	}
	if ratios {
		for _, p := range s.peers() {
			cells = append(cells, s.ratioCell(scenario, p, unit, higherIsBetter))
		}
	}
	fmt.Fprintf(b, "| %s |\n", strings.Join(cells, " | "))
}

func (s *Summary) throughputTable(b *strings.Builder) {
	scs := s.scenariosWith("qos")
	if len(scs) == 0 {
		return
	}
	section(b, "Throughput: messages received by all subscribers per second",
		"`qos0-10x10`: QoS 0, 10 publishers each to its own subscriber; `1x1000`: one publisher, "+
			"1,000 subscribers of its topic. Publishers send as fast as the broker takes messages, QoS 1 ones "+
			"with a window of unacknowledged messages.")
	s.tableHead(b, ours+" ÷ %s", "scenario")
	for _, sc := range scs {
		s.row(b, sc, "msgs/s", true, true, "`"+sc+"`")
	}
	fmt.Fprintln(b)
	paragraph(b, "Messages delivered per message sent, in % of the subscribers that should get it: "+
		"below 100, the broker dropped QoS 0 messages. Approximate, since messages are in flight at both ends "+
		"of the interval; n/a for QoS 0 fan-out, where the messages buffered between publisher and broker "+
		"outnumber those published while measuring.")
	s.tableHead(b, "", "scenario")
	for _, sc := range scs {
		s.row(b, sc, "delivered-%", false, false, "`"+sc+"`")
	}
	fmt.Fprintln(b)
}

func (s *Summary) latencyTable(b *strings.Builder) {
	scs := s.scenariosWith("latency-")
	if len(scs) == 0 {
		return
	}
	section(b, "Latency at a fixed rate, µs",
		"`latency-qos0-10x10-1000mps`: 10 publishers, each to its own subscriber, 1,000 messages per second "+
			"in total; from the publisher's write to the subscriber's read.")
	s.tableHead(b, "%s ÷ "+ours, "scenario", "")
	for _, sc := range scs {
		for i, q := range []string{"p50", "p90", "p99", "max"} {
			name := ""
			if i == 0 {
				name = "`" + sc + "`"
			}
			s.row(b, sc, q+"-us", true, false, name, q)
		}
	}
	fmt.Fprintln(b)
}

func (s *Summary) memoryTable(b *strings.Builder) {
	var scs []string
	scs = append(scs, s.scenariosWith("idle-")...)
	scs = append(scs, s.scenariosWith("subs-")...)
	if len(scs) == 0 {
		return
	}
	section(b, "Memory: broker process after minus before",
		"`idle-Nconns-5subs`: N idle connections with 5 subscriptions each, per connection; "+
			"`subs-Cconns-Ssubs`: S distinct subscriptions (15% with wildcards) over C connections, per subscription. "+
			"Each on a freshly started broker. RSS is VmRSS from /proc; heap is what the broker publishes under $SYS "+
			"(fieldgate and Mosquitto: `$SYS/broker/heap/current`, mochi: `$SYS/broker/system/memory`, the Go heap in use), "+
			"n/a when it publishes none.")
	s.tableHead(b, "%s ÷ "+ours, "scenario", "figure")
	for _, sc := range scs {
		per := "conn"
		if strings.HasPrefix(sc, "subs-") {
			per = "sub"
		}
		s.row(b, sc, "rss-B/"+per, true, false, "`"+sc+"`", "RSS B/"+per)
		s.row(b, sc, "heap-B/"+per, true, false, "", "heap B/"+per)
		s.row(b, sc, "rss-MiB", true, false, "", "RSS MiB, total")
	}
	fmt.Fprintln(b)
}

func (s *Summary) problems(b *strings.Builder) {
	if len(s.skips) == 0 && len(s.warnings) == 0 {
		return
	}
	section(b, "Skipped runs and warnings", "")
	for _, br := range s.brokers {
		if r := s.skips[br]; len(r) > 0 {
			fmt.Fprintf(b, "- %s skipped in %d run(s): %s\n", br, len(r), r[0])
		}
	}
	for i, w := range s.warnings {
		if i == maxWarnings {
			fmt.Fprintf(b, "- ... and %d more warnings in the raw output\n", len(s.warnings)-maxWarnings)
			break
		}
		fmt.Fprintf(b, "- %s\n", w)
	}
	fmt.Fprintln(b)
}

// section starts a "##" section, with an introductory paragraph unless intro is empty.
func section(b *strings.Builder, title, intro string) {
	fmt.Fprintf(b, "## %s\n\n", title)
	if intro != "" {
		paragraph(b, intro)
	}
}

func paragraph(b *strings.Builder, text string) { fmt.Fprintf(b, "%s\n\n", text) }

// fmtNum keeps about three significant digits, with thousands separators
// above 1,000.
func fmtNum(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 100:
		return groupThousands(strconv.FormatFloat(math.Round(v), 'f', 0, 64))
	case a >= 10 || a == math.Trunc(a):
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// fmtConst formats a target as written in the source: 1.5, 4.
func fmtConst(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func fmtRatio(r float64) string {
	if r >= 10 {
		return strconv.FormatFloat(r, 'f', 1, 64) + "×"
	}
	return strconv.FormatFloat(r, 'f', 2, 64) + "×"
}

func groupThousands(digits string) string {
	sign := ""
	if strings.HasPrefix(digits, "-") {
		sign, digits = "-", digits[1:]
	}
	var out []byte
	for i := range len(digits) {
		if i > 0 && (len(digits)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, digits[i])
	}
	return sign + string(out)
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
