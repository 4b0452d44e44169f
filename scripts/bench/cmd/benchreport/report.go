package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// report gathers the results and writes the Markdown and the plots.
type report struct {
	dir    string // results directory
	out    string // Markdown file
	svgDir string // plots directory
	arch   string // GOARCH of the broker benchmarks' raw files
	quick  bool

	warnings []string // said on stderr: missing or stale inputs

	run     meta      // bench-all.sh's record of the run; empty without one
	started time.Time // when that run started; zero when unknown
	md      strings.Builder
	plots   []svgFile
}

type svgFile struct {
	name string
	data []byte
}

// comparison is one section of the report, fed by results/STEM-summary.md.
type comparison struct {
	stem   string
	label  string                              // in the headline table, and the heading when the summary has no title
	script string                              // what writes the summary
	extra  func(r *report, w *strings.Builder) // plots and tables after the summary's introduction
}

var comparisonList = []comparison{
	{stem: "matcher", label: "matcher", script: "bench-matcher.sh", extra: (*report).matcherPlots},
	{stem: "broker", label: "broker", script: "bench-broker.sh", extra: (*report).brokerSweeps},
	{stem: "storage", label: "storage", script: "bench-storage.sh"},
	{stem: "bridge", label: "bridge", script: "bench-bridge.sh"},
	{stem: "footprint", label: "footprint", script: "bench-footprint.sh"},
}

// loaded is a comparison's summary as found on disk.
type loaded struct {
	comparison
	path string // "" when there is none
	note string // why it may not be from this run
	doc  summaryDoc
}

// write writes the report and its plots and returns the files written.
func (r *report) write() ([]string, error) {
	if p, note := r.find("bench-all", ".txt"); p != "" {
		if note != "" {
			r.warnings = append(r.warnings, p+": "+note)
		}
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		r.run, err = readMeta(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if s, err := strconv.ParseInt(r.run.get("start"), 10, 64); err == nil {
			r.started = time.Unix(s, 0)
		}
	} else {
		r.warnings = append(r.warnings, "no bench-all record in "+r.dir+": machine and versions unknown")
	}

	var all []loaded
	for _, c := range comparisonList {
		l := loaded{comparison: c}
		l.path, l.note = r.find(c.stem, "-summary.md")
		if l.path != "" {
			text, err := os.ReadFile(l.path)
			if err != nil {
				return nil, err
			}
			l.doc = parseSummary(string(text))
			if l.note != "" {
				r.warnings = append(r.warnings, l.path+": "+l.note)
			}
		} else {
			r.warnings = append(r.warnings, fmt.Sprintf("no %s summary in %s", c.stem, r.dir))
		}
		all = append(all, l)
	}

	w := &r.md
	r.writeIntro(w)
	r.writeMachine(w)
	r.writeHeadline(w, all)
	for _, l := range all {
		r.writeComparison(w, l)
	}

	if err := os.MkdirAll(filepath.Dir(r.out), 0o755); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(r.svgDir, 0o755); err != nil {
		return nil, err
	}
	var written []string
	for _, p := range r.plots {
		name := filepath.Join(r.svgDir, p.name)
		if err := os.WriteFile(name, p.data, 0o644); err != nil {
			return nil, err
		}
		written = append(written, name)
	}
	if err := os.WriteFile(r.out, []byte(w.String()), 0o644); err != nil {
		return nil, err
	}
	return append(written, r.out), nil
}

// find returns the results file STEM+SUFFIX of this run's mode
// (STEM-quick+SUFFIX for a quick run, else a full run's), and a note when
// it is not from this run: a full run's file in a quick report, or a file
// older than the run's start.
func (r *report) find(stem, suffix string) (path, note string) {
	names := []string{stem + suffix}
	if r.quick {
		names = []string{stem + "-quick" + suffix, stem + suffix}
	}
	for i, n := range names {
		p := filepath.Join(r.dir, n)
		st, err := os.Stat(p)
		if err != nil {
			continue
		}
		var notes []string
		if i > 0 {
			notes = append(notes, "from a full run: this quick run wrote no "+names[0])
		}
		if !r.started.IsZero() && st.ModTime().Before(r.started) {
			notes = append(notes, "written "+st.ModTime().UTC().Format("2006-01-02 15:04 MST")+
				", before this run started, so it is from an earlier run")
		}
		return p, strings.Join(notes, "; ")
	}
	return "", ""
}

// rawFiles returns the raw output files results/STEM-*SUFFIX of this
// run's mode (STEM-*quick-*SUFFIX for a quick run), sorted.
func (r *report) rawFiles(stem, suffix string) []string {
	matches, _ := filepath.Glob(filepath.Join(r.dir, stem+"-*"+suffix)) // the pattern is well formed
	var out []string
	for _, m := range matches {
		if r.quick == strings.Contains(filepath.Base(m), "-quick-") {
			out = append(out, m)
		}
	}
	slices.Sort(out)
	return out
}

// link returns a Markdown link from the report to path.
func (r *report) link(path string) string {
	return fmt.Sprintf("[%s](%s)", filepath.Base(path), r.relative(path))
}

// relative returns path as the report refers to it: relative to the
// report's directory, with forward slashes.
func (r *report) relative(path string) string {
	from, err1 := filepath.Abs(filepath.Dir(r.out))
	to, err2 := filepath.Abs(path)
	rel, err3 := filepath.Rel(from, to)
	if err1 != nil || err2 != nil || err3 != nil {
		rel = path
	}
	return filepath.ToSlash(rel)
}

// plot renders p into the file name under the plots directory and returns
// the Markdown that shows it, or a line saying there was nothing to plot.
func (r *report) plot(name string, p Plot) string {
	var b bytes.Buffer
	if err := p.WriteSVG(&b); err != nil {
		r.warnings = append(r.warnings, name+": "+err.Error())
		return fmt.Sprintf("_%s: no results to plot._", p.Title)
	}
	r.plots = append(r.plots, svgFile{name, b.Bytes()})
	return fmt.Sprintf("![%s](%s)", p.Title, r.relative(filepath.Join(r.svgDir, name)))
}

func (r *report) writeIntro(w *strings.Builder) {
	w.WriteString("# Benchmarks: fieldgate side by side\n\n")
	if r.quick {
		w.WriteString("> [!WARNING]\n" +
			"> **QUICK RUN: THESE ARE NOT BENCHMARK RESULTS.** This file was written by `QUICK=1 ./bench-all.sh`, " +
			"a smoke run of the whole pipeline: one repetition, intervals of a second or two, small workloads " +
			"(no 1M-subscription matcher rows). Its figures show that every part runs, not how fast. " +
			"Run `make bench` for the real report, which replaces this one.\n\n")
	}
	paced := ""
	if strings.Contains(" "+r.run.get("settings")+" ", " PACED_RATE=0 ") {
		paced = " (without the paced run of `bench-bridge.sh`, whose drain rate is the pace it is given)"
	}
	w.WriteString("fieldgate's parts measured against established implementations on one machine, one at a time:\n\n" +
		"- **matcher**: the subscription index against mochi-mqtt's `TopicsIndex` and the NATS server's generic sublist, on amd64 and 386 (the 32-bit stand-in for ARMv6/v7 gateways);\n" +
		"- **broker**: the whole broker over TCP against mochi-mqtt's full `Server` and Mosquitto: throughput, latency, memory per idle connection and per subscription, and memory against the number of subscriptions and connections;\n" +
		"- **storage**: persisted QoS 1 publishing against mochi-mqtt with its bolt hook and Mosquitto with persistence;\n" +
		"- **bridge**: the bridge and its durable outbox against Mosquitto's bridge, through an outage of the upstream" + paced + ";\n" +
		"- **footprint**: binary sizes and memory on 32-bit targets, when `bench-footprint.sh` is there.\n\n" +
		"Every figure is the median of several runs (the repetitions are stated per section); ratios are taken so that above 1 is better for fieldgate.\n\n")
	w.WriteString("## Reproducing\n\n" +
		"```sh\n" +
		"make bench                                  # everything, then this file and docs/bench/*.svg (about 45 minutes on 2 cores)\n" +
		"cd scripts/bench && QUICK=1 ./bench-all.sh   # smoke run of the pipeline in 5 to 6 minutes; its report says so\n" +
		"cd scripts/bench && PARTS= ./bench-all.sh    # rewrite this file from the results already there\n" +
		"```\n\n" +
		"`scripts/bench/README.md` describes each comparison, its script and its knobs (`COUNT`, `QUICK`, `CONNS`, `SUBS`, ...). " +
		"Each script also runs alone (`make bench-matcher`, `bench-broker`, `bench-storage`, `bench-bridge`) and writes its summary to `scripts/bench/results/`, which the sections below embed.\n\n")
}

func (r *report) writeMachine(w *strings.Builder) {
	w.WriteString("## Machine and versions\n\n")
	if len(r.run) == 0 {
		w.WriteString("Unknown: `bench-all.sh` wrote no record of the run (`results/bench-all.txt`). The sections below state what each script saw.\n\n")
		return
	}
	w.WriteString("| | |\n|---|---|\n")
	for _, row := range [][2]string{
		{"CPU", "cpu"}, {"cores", "cores"}, {"memory", "memory"}, {"kernel", "kernel"}, {"OS", "os"},
		{"Go", "go"}, {"fieldgate", "fieldgate"}, {"mochi-mqtt", "mochi"}, {"NATS server", "nats"},
		{"Mosquitto", "mosquitto"}, {"bbolt", "bbolt"},
	} {
		v := r.run.get(row[1])
		if v == "" {
			v = "unknown"
		}
		fmt.Fprintf(w, "| %s | %s |\n", row[0], cell(v))
	}
	w.WriteString("\n")

	mode := r.run.get("mode")
	fmt.Fprintf(w, "Run: **%s**, started %s", orUnknown(mode), orUnknown(r.run.get("date")))
	if s := r.run.get("settings"); s != "" {
		fmt.Fprintf(w, ", with %s", s)
	}
	w.WriteString(". One part after the other; other work on the machine still shows in the figures (each summary gives the load average), " +
		"and a part's time includes any wait for another benchmark run to finish.\n\n")
	if parts := r.run["part"]; len(parts) > 0 {
		w.WriteString("| part | status | time |\n|---|---|--:|\n")
		for _, p := range parts {
			f := strings.Fields(p)
			if len(f) < 3 {
				continue
			}
			secs, _ := strconv.Atoi(f[2])
			fmt.Fprintf(w, "| %s | %s | %s |\n", f[0], f[1], duration(secs))
		}
		if s, err := strconv.Atoi(r.run.get("elapsed")); err == nil {
			fmt.Fprintf(w, "| **total** | | **%s** |\n", duration(s))
		}
		w.WriteString("\n")
	}
}

func (r *report) writeHeadline(w *strings.Builder, all []loaded) {
	w.WriteString("## Targets\n\n" +
		"Every target set for fieldgate against its peers, as each comparison's summary judges it (its \"Targets\" section; for the matcher, every workload row of both architectures).\n\n" +
		"| comparison | target | measured | verdict |\n|---|---|---|---|\n")
	var missedN, metN int
	for _, l := range all {
		if l.path == "" {
			continue
		}
		ts := targets(l.doc)
		if l.stem == "matcher" {
			ts = matcherHeadline(l.doc)
		}
		for _, t := range ts {
			switch t.verdict {
			case met:
				metN++
			case missed:
				missedN++
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s |\n", l.label, cell(t.text), cell(t.result), t.verdict)
		}
	}
	fmt.Fprintf(w, "\n%d targets met, %d missed.", metN, missedN)
	var absent []string
	for _, l := range all {
		if l.path == "" {
			absent = append(absent, l.label)
		}
	}
	if len(absent) > 0 {
		fmt.Fprintf(w, " No results for: %s.", strings.Join(absent, ", "))
	}
	w.WriteString("\n\n")
}

func (r *report) writeComparison(w *strings.Builder, l loaded) {
	title := l.doc.title
	if title == "" {
		title = strings.ToUpper(l.label[:1]) + l.label[1:]
	}
	fmt.Fprintf(w, "## %s\n\n", title)
	if l.path == "" {
		name := l.stem + "-summary.md"
		if r.quick {
			name = l.stem + "-quick-summary.md"
		}
		fmt.Fprintf(w, "No results: `%s` wrote no `%s`.\n\n", l.script, name)
		if l.extra != nil {
			l.extra(r, w)
		}
		return
	}
	fmt.Fprintf(w, "From %s, written by `scripts/bench/%s`.", r.link(l.path), l.script)
	if l.note != "" {
		fmt.Fprintf(w, " **Note: %s.**", l.note)
	}
	w.WriteString("\n\n")
	if len(l.doc.intro) > 0 {
		w.WriteString(strings.Join(l.doc.intro, "\n") + "\n\n")
	}
	if l.extra != nil {
		l.extra(r, w)
	}
	if len(l.doc.body) > 0 {
		// The title is a level-2 heading here: its sections go one below.
		w.WriteString(strings.Join(shiftHeadings(l.doc.body, 3-l.doc.level), "\n") + "\n\n")
	}
}

// Broker benchmark names of the two memory scenarios, with the broker and
// the count swept.
var (
	idleRE = regexp.MustCompile(`^BenchmarkBroker/([^/]+)/idle-(\d+)conns-\d+subs$`)
	subsRE = regexp.MustCompile(`^BenchmarkBroker/([^/]+)/subs-\d+conns-(\d+)subs$`)
)

// brokerSweeps writes the memory scenarios at every size measured: the
// broker run's own and bench-all.sh's sweeps (results/sweep-*.txt).
func (r *report) brokerSweeps(w *strings.Builder) {
	set := newBenchSet()
	var files []string
	if p, _ := r.find("broker", "-"+r.arch+".txt"); p != "" {
		files = append(files, p)
	}
	files = append(files, r.rawFiles("sweep", "-"+r.arch+".txt")...)
	for _, f := range files {
		if err := set.readFile(f); err != nil {
			r.warnings = append(r.warnings, err.Error())
		}
	}
	subs, conns := collect(set, subsRE), collect(set, idleRE)
	runs := 0
	for _, name := range set.names {
		if subsRE.MatchString(name) || idleRE.MatchString(name) {
			runs = max(runs, len(set.vals[name]["rss-MiB"]))
		}
	}

	w.WriteString("### Against the number of subscriptions and connections\n\n")
	if len(files) == 0 {
		w.WriteString("No results: neither the broker run nor the sweeps of `bench-all.sh` wrote raw output.\n\n")
		return
	}
	var links []string
	for _, f := range files {
		links = append(links, r.link(f))
	}
	fmt.Fprintf(w, "The two memory scenarios of the broker run, repeated by `bench-all.sh` at more sizes (`SCENARIOS=\"idle subs\"` with other `CONNS` and `SUBS`), "+
		"each on a freshly started broker: `subs`, N distinct subscriptions (15%% with wildcards) over 100 connections; `idle`, N idle connections with 5 subscriptions each. "+
		"RSS is the broker's whole resident set once they are set up; the rates are how fast the broker set them up "+
		"(subscriptions, or connections with their subscriptions, per second). %s Raw output: %s.\n\n", repetitions(runs), strings.Join(links, ", "))

	for _, k := range []struct {
		file     string // plots: broker-FILE-*.svg
		counted  string // what the x axis counts
		xlabel   string
		perUnit  string // RSS per subscription or connection
		perText  string
		rateUnit string // how fast they were set up
		rateText string
		title    string // of the throughput plot
		c        curves
	}{
		{"subs", "subscriptions", "subscriptions (over 100 connections)", "rss-B/sub", "RSS bytes per subscription",
			"subs/s", "subscriptions set up per second", "Subscribe throughput against subscriptions", subs},
		{"conns", "idle connections", "idle connections (5 subscriptions each)", "rss-B/conn", "RSS bytes per connection",
			"conns/s", "connections set up per second", "Connection throughput against connections", conns},
	} {
		w.WriteString(r.plot("broker-"+k.file+"-rss.svg", curvePlot(k.c, "rss-MiB",
			"Broker memory against "+k.counted, k.xlabel, "RSS, MiB", true)) + "\n")
		w.WriteString(r.plot("broker-"+k.file+"-throughput.svg", curvePlot(k.c, k.rateUnit,
			k.title, k.xlabel, k.rateText, false)) + "\n\n")
		writeCurveTable(w, k.c, k.counted, "rss-MiB", "RSS, MiB", false)
		writeCurveTable(w, k.c, k.counted, k.perUnit, k.perText, false)
		writeCurveTable(w, k.c, k.counted, k.rateUnit, k.rateText, true)
	}
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
func writeCurveTable(w *strings.Builder, c curves, counted, unit, what string, higherBetter bool) {
	if len(c.counts) == 0 {
		return
	}
	peers := slices.DeleteFunc(slices.Clone(c.impls), func(s string) bool { return s == implOrder[0] })
	ours := slices.Contains(c.impls, implOrder[0])
	fmt.Fprintf(w, "%s:\n\n| %s |", strings.ToUpper(what[:1])+what[1:], counted)
	for _, impl := range c.impls {
		fmt.Fprintf(w, " %s |", impl)
	}
	if ours {
		for _, p := range peers {
			if higherBetter {
				fmt.Fprintf(w, " fieldgate ÷ %s |", p)
			} else {
				fmt.Fprintf(w, " %s ÷ fieldgate |", p)
			}
		}
	}
	w.WriteString("\n|--:|" + strings.Repeat("--:|", len(c.impls)))
	if ours {
		w.WriteString(strings.Repeat("--:|", len(peers)))
	}
	w.WriteString("\n")
	for _, n := range c.counts {
		fmt.Fprintf(w, "| %s |", fmtNum(n))
		for _, impl := range c.impls {
			if v, ok := c.value(impl, n, unit); ok {
				fmt.Fprintf(w, " %s |", fmtNum(v))
			} else {
				w.WriteString(" – |")
			}
		}
		if ours {
			fg, okF := c.value(implOrder[0], n, unit)
			for _, p := range peers {
				v, okP := c.value(p, n, unit)
				switch {
				case !okF || !okP || fg <= 0 || v <= 0:
					w.WriteString(" – |")
				case higherBetter:
					fmt.Fprintf(w, " %s |", fmtRatio(fg/v))
				default:
					fmt.Fprintf(w, " %s |", fmtRatio(v/fg))
				}
			}
		}
		w.WriteString("\n")
	}
	w.WriteString("\n")
}

// matcherRE picks the workload family the matcher plots follow across
// sizes: 10% wildcards, distinct prefixes, depth 5, no fan-out.
var matcherRE = regexp.MustCompile(`^BenchmarkMatch/impl=([^/]+)/subs=(\d+)/wild=10/prefix=distinct/depth=5/fanout=1(?:-\d+)?$`)

// matcherPlots writes the matcher's lookup time and memory against the
// number of subscriptions, one line per implementation and GOARCH.
func (r *report) matcherPlots(w *strings.Builder) {
	type archCurves struct {
		arch string
		c    curves
	}
	var all []archCurves
	for _, f := range r.rawFiles("matcher", ".txt") {
		arch := strings.TrimSuffix(filepath.Base(f), ".txt")
		arch = arch[strings.LastIndex(arch, "-")+1:]
		set := newBenchSet()
		if err := set.readFile(f); err != nil {
			r.warnings = append(r.warnings, err.Error())
			continue
		}
		all = append(all, archCurves{arch, collect(set, matcherRE)})
	}
	// The host's architecture first, drawn solid; the others dashed.
	slices.SortStableFunc(all, func(a, b archCurves) int {
		return boolInt(a.arch != r.arch) - boolInt(b.arch != r.arch)
	})
	ns := Plot{Title: "Matcher lookup time against subscriptions", XLabel: "subscriptions (10% wildcards, distinct prefix, depth 5)",
		YLabel: "ns per lookup", LogY: true}
	mem := Plot{Title: "Matcher memory per subscription", XLabel: "subscriptions (10% wildcards, distinct prefix, depth 5)",
		YLabel: "bytes per subscription", LogY: true}
	for _, a := range all {
		for _, impl := range a.c.impls {
			name := impl + " (" + a.arch + ")"
			dashed := a.arch != r.arch
			ns.Series = append(ns.Series, Series{Name: name, Points: a.c.points(impl, "ns/op"), Dashed: dashed})
			mem.Series = append(mem.Series, Series{Name: name, Points: a.c.points(impl, "bytes/sub"), Dashed: dashed})
		}
	}
	w.WriteString("### Against the number of subscriptions\n\n" +
		"One workload family of the tables below at every size measured (`w10% distinct d5 f1`): medians of the runs, " +
		"dashed lines for 386. Lookup time is per publish topic; memory is the heap the index adds per subscription.\n\n")
	w.WriteString(r.plot("matcher-ns.svg", ns) + "\n")
	w.WriteString(r.plot("matcher-bytes.svg", mem) + "\n\n")
}

// repetitions says how many runs each point's median is over.
func repetitions(n int) string {
	if n == 1 {
		return "One run per point."
	}
	return fmt.Sprintf("Medians of up to %d runs per point.", n)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// fmtNum writes a figure with thousands separators from 1,000 up and
// three significant digits below.
func fmtNum(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1000:
		s := strconv.FormatFloat(math.Round(a), 'f', 0, 64)
		var b strings.Builder
		if v < 0 {
			b.WriteByte('-')
		}
		for i, c := range s {
			if i > 0 && (len(s)-i)%3 == 0 {
				b.WriteByte(',')
			}
			b.WriteRune(c)
		}
		return b.String()
	case a >= 100 || a == math.Trunc(a):
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// fmtRatio writes a ratio with two decimals below 10 and one above.
func fmtRatio(v float64) string {
	if v >= 10 {
		return strconv.FormatFloat(v, 'f', 1, 64) + "×"
	}
	return strconv.FormatFloat(v, 'f', 2, 64) + "×"
}

// duration writes seconds as "19 min 12 s".
func duration(secs int) string {
	if secs < 60 {
		return fmt.Sprintf("%d s", secs)
	}
	return fmt.Sprintf("%d min %02d s", secs/60, secs%60)
}

// cell makes s safe inside a Markdown table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
