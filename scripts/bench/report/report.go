package report

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fieldgate/fieldgate/scripts/bench/targets"
)

// Report writes docs/BENCHMARKS.md and its plots from the raw output of
// every comparison in a results directory.
type Report struct {
	Results string // directory of the benchmarks' raw output
	Out     string // the report's path
	SVGDir  string // directory of the plots, linked from the report
	Arch    string // GOARCH of the broker benchmarks' raw files
	Quick   bool   // report on the results of QUICK=1 runs (*-quick-*), marked as such

	// Warnings say what was missing or stale; Write fills it.
	Warnings []string

	record  meta      // bench-all.sh's record of the run; empty without one
	started time.Time // when that run started; zero when unknown
	md      markdown
	plots   []svgFile
}

type svgFile struct {
	name string
	data []byte
}

// section is one comparison as the report found it.
type section struct {
	comparison
	files []string // raw files; none when there are no results
	note  string   // why they may not be from this run
	sum   summary
}

// Write writes the report and its plots and returns the files written.
func (r *Report) Write() ([]string, error) {
	name := "bench-all.txt"
	if r.Quick {
		name = "bench-all-quick.txt"
	}
	if f, err := readRaw(filepath.Join(r.Results, name)); err == nil {
		r.record = f.meta
		if s, err := strconv.ParseInt(r.record.get("start"), 10, 64); err == nil {
			r.started = time.Unix(s, 0)
		}
	} else if os.IsNotExist(err) {
		r.Warnings = append(r.Warnings, "no bench-all record in "+r.Results+": machine and versions unknown")
	} else {
		return nil, err
	}

	var all []section
	for _, c := range comparisons {
		s, err := r.load(c)
		if err != nil {
			return nil, err
		}
		all = append(all, s)
	}

	w := &r.md
	r.writeIntro(w)
	r.writeMachine(w)
	r.writeHeadline(w, all)
	if err := r.writeReading(w); err != nil {
		return nil, err
	}
	for _, s := range all {
		r.writeSection(w, s)
	}

	if err := os.MkdirAll(filepath.Dir(r.Out), 0o755); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(r.SVGDir, 0o755); err != nil {
		return nil, err
	}
	var written []string
	for _, p := range r.plots {
		name := filepath.Join(r.SVGDir, p.name)
		if err := os.WriteFile(name, p.data, 0o644); err != nil {
			return nil, err
		}
		written = append(written, name)
	}
	if err := os.WriteFile(r.Out, []byte(w.document()), 0o644); err != nil {
		return nil, err
	}
	return append(written, r.Out), nil
}

// load finds and reads the raw files of c: this run's mode's
// (NAME-quick-ARCH.txt for a quick run), or for a quick run without them a
// full run's, with a note.
func (r *Report) load(c comparison) (section, error) {
	s := section{comparison: c}
	s.files = r.rawFiles(c, r.Quick)
	if len(s.files) == 0 && r.Quick {
		if s.files = r.rawFiles(c, false); len(s.files) > 0 {
			s.note = "from a full run: this quick run wrote no " + r.rawName(c)
		}
	}
	if len(s.files) == 0 {
		r.Warnings = append(r.Warnings, fmt.Sprintf("no %s results in %s", c.name, r.Results))
		return s, nil
	}
	files, err := readAll(s.files)
	if err != nil {
		return s, err
	}
	if n := r.stale(c.name, files); n != "" {
		s.note = strings.TrimPrefix(s.note+"; "+n, "; ")
	}
	if s.note != "" {
		r.Warnings = append(r.Warnings, c.name+": "+s.note)
	}
	s.sum = c.read(files, r.record)
	return s, nil
}

// rawName is the raw file of c this run's mode looks for first.
func (r *Report) rawName(c comparison) string {
	arch := r.Arch
	if c.perArch {
		arch = "ARCH"
	}
	if r.Quick {
		return c.name + "-quick-" + arch + ".txt"
	}
	return c.name + "-" + arch + ".txt"
}

// rawFiles returns the raw files of c of a quick run or a full one: every
// GOARCH's, the host's first, or the host's alone.
func (r *Report) rawFiles(c comparison, quick bool) []string {
	stem := c.name + "-"
	if quick {
		stem += "quick-"
	}
	if !c.perArch {
		p := filepath.Join(r.Results, stem+r.Arch+".txt")
		if _, err := os.Stat(p); err != nil {
			return nil
		}
		return []string{p}
	}
	out := r.glob(c.name+"-*.txt", quick)
	host := filepath.Join(r.Results, stem+r.Arch+".txt")
	slices.SortStableFunc(out, func(a, b string) int {
		return boolInt(a != host) - boolInt(b != host)
	})
	return out
}

// glob returns the files of the results directory that match pattern and
// come from a quick run or from a full one, sorted.
func (r *Report) glob(pattern string, quick bool) []string {
	matches, _ := filepath.Glob(filepath.Join(r.Results, pattern)) // the patterns are well formed
	return slices.DeleteFunc(matches, func(m string) bool {
		return quick != strings.Contains(filepath.Base(m), "-quick-")
	})
}

// stale says why files, the results of part, may be from an earlier run
// than bench-all.sh's record: the record lists the parts it ran, and each
// raw file gives the date its run began (or, without a date line, the time
// it was last written).
func (r *Report) stale(part string, files []*rawFile) string {
	if len(r.record) == 0 {
		return ""
	}
	ran := len(r.record["part"]) == 0
	for _, p := range r.record["part"] {
		if f := strings.Fields(p); len(f) >= 2 && f[0] == part && f[1] != "skipped" {
			ran = true
		}
	}
	dated := ""
	for _, f := range files {
		if d := f.meta.get("date"); d != "" {
			dated = d
		}
	}
	if !ran {
		note := "from an earlier run: this one did not run the " + part + " part"
		if dated != "" {
			note += " (the raw output is dated " + dated + ")"
		}
		return note
	}
	if r.started.IsZero() {
		return ""
	}
	if dated != "" {
		if t, err := time.Parse("2006-01-02T15:04Z", dated); err == nil && t.Before(r.started.Truncate(time.Minute)) {
			return "dated " + dated + ", before this run started, so it is from an earlier run"
		}
		return ""
	}
	for _, f := range files {
		if st, err := os.Stat(f.name); err == nil && st.ModTime().Before(r.started) {
			return "written " + st.ModTime().UTC().Format("2006-01-02 15:04 MST") +
				", before this run started, so it is from an earlier run"
		}
	}
	return ""
}

// link returns a Markdown link from the report to path.
func (r *Report) link(path string) string {
	return fmt.Sprintf("[%s](%s)", filepath.Base(path), r.relative(path))
}

// relative returns path as the report refers to it: relative to the
// report's directory, with forward slashes.
func (r *Report) relative(path string) string {
	from, err1 := filepath.Abs(filepath.Dir(r.Out))
	to, err2 := filepath.Abs(path)
	rel, err3 := filepath.Rel(from, to)
	if err1 != nil || err2 != nil || err3 != nil {
		rel = path
	}
	return filepath.ToSlash(rel)
}

// plot renders p into the file name under the plots directory and returns
// the Markdown that shows it, or a line saying there was nothing to plot.
func (r *Report) plot(name string, p Plot) string {
	var b bytes.Buffer
	if err := p.WriteSVG(&b); err != nil {
		r.Warnings = append(r.Warnings, name+": "+err.Error())
		return fmt.Sprintf("_%s: no results to plot._", p.Title)
	}
	r.plots = append(r.plots, svgFile{name, b.Bytes()})
	return fmt.Sprintf("![%s](%s)", p.Title, r.relative(filepath.Join(r.SVGDir, name)))
}

func (r *Report) writeIntro(w *markdown) {
	w.heading(1, "Benchmarks: fieldgate side by side")
	if r.Quick {
		w.para("> [!WARNING]\n" +
			"> **QUICK RUN: THESE ARE NOT BENCHMARK RESULTS.** This file was written by `QUICK=1 ./bench-all.sh`, " +
			"a smoke run of the whole pipeline: one repetition, intervals of a second or two, small workloads " +
			"(no 1M-subscription matcher rows). Its figures show that every part runs, not how fast. " +
			"Run `make bench` for the real report, which replaces this one.")
	}
	paced := ""
	if strings.Contains(" "+r.record.get("settings")+" ", " PACED_RATE=0 ") {
		paced = " (without the paced run of `bench-bridge.sh`, whose drain rate is the pace it is given)"
	}
	w.para("fieldgate's parts measured against established implementations on one machine, one at a time, and what it costs at rest:")
	w.list(
		"**matcher**: the subscription index against mochi-mqtt's `TopicsIndex` and the NATS server's generic sublist, on amd64 and 386 (the 32-bit stand-in for ARMv6/v7 gateways);",
		"**broker**: the whole broker over TCP against mochi-mqtt's full `Server` and Mosquitto: throughput, latency, memory per idle connection and per subscription, and memory against the number of subscriptions and connections;",
		"**storage**: persisted QoS 1 publishing against mochi-mqtt with its bolt hook and Mosquitto with persistence;",
		"**bridge**: the bridge and its durable outbox against Mosquitto's bridge, through an outage of the upstream"+paced+";",
		"**footprint**: binary sizes and memory on 32-bit targets, when `bench-footprint.sh` is there;",
		"**idle**: the CPU time of a gateway at rest, ready and bridged with no client traffic, against a limit of its own.",
	)
	w.para("Every figure is the median of several runs (the repetitions are stated per section); ratios are taken so that above 1 is better for fieldgate.")
	w.heading(2, "Reproducing")
	w.para("```sh\n" +
		"make bench                                  # everything, then this file and docs/bench/*.svg (about 51 minutes on 2 cores)\n" +
		"cd scripts/bench && QUICK=1 ./bench-all.sh   # smoke run of the pipeline in 6 to 7 minutes; its report says so\n" +
		"cd scripts/bench && PARTS= ./bench-all.sh    # rewrite this file from the results already there\n" +
		"```")
	w.para("`scripts/bench/README.md` describes each comparison, its script and its knobs (`COUNT`, `QUICK`, `CONNS`, `SUBS`, ...). " +
		"Each script also runs alone (`make bench-matcher`, `bench-broker`, `bench-storage`, `bench-bridge`, `bench-footprint`, `bench-idle`) and writes its raw output and its summary to `scripts/bench/results/`; " +
		"the sections below are made from the raw output by `scripts/bench/cmd/benchreport`, the one generator of this file and of the summaries.")
}

func (r *Report) writeMachine(w *markdown) {
	w.heading(2, "Machine and versions")
	if len(r.record) == 0 {
		w.para("Unknown: `bench-all.sh` wrote no record of the run (`results/bench-all.txt`). The sections below state what each script saw.")
		return
	}
	var rows [][]string
	for _, row := range [][2]string{
		{"CPU", "cpu"}, {"cores", "cores"}, {"memory", "memory"}, {"kernel", "kernel"}, {"OS", "os"},
		{"Go", "go"}, {"fieldgate", "fieldgate"}, {"mochi-mqtt", "mochi"}, {"NATS server", "nats"},
		{"Mosquitto", "mosquitto"}, {"bbolt", "bbolt"},
	} {
		rows = append(rows, []string{row[0], cell(orUnknown(r.record.get(row[1])))})
	}
	w.table("ll", []string{"", ""}, rows...)
	for _, note := range r.record["note"] {
		w.para(note)
	}

	text := fmt.Sprintf("Run: **%s**, started %s", orUnknown(r.record.get("mode")), orUnknown(r.record.get("date")))
	if s := r.record.get("settings"); s != "" {
		text += ", with " + s
	}
	w.para(text + ". One part after the other; other work on the machine still shows in the figures (each summary gives the load average), " +
		"and a part's time includes any wait for another benchmark run to finish.")
	if parts := r.record["part"]; len(parts) > 0 {
		rows = nil
		for _, p := range parts {
			f := strings.Fields(p)
			if len(f) < 3 {
				continue
			}
			secs, _ := strconv.Atoi(f[2])
			rows = append(rows, []string{f[0], f[1], duration(secs)})
		}
		if s, err := strconv.Atoi(r.record.get("elapsed")); err == nil {
			rows = append(rows, []string{"**total**", "", "**" + duration(s) + "**"})
		}
		w.table("ll", []string{"part", "status", "time"}, rows...)
	}
}

func (r *Report) writeHeadline(w *markdown, all []section) {
	w.heading(2, "Targets")
	w.para(fmt.Sprintf("Every target set for fieldgate against its peers is in one file, [%s](%s), which says what each is judged on. "+
		"Below, each as its comparison judges it (for the matcher, every workload row of both architectures).",
		targets.File, r.relative(filepath.Join(r.Results, "..", "targets", filepath.Base(targets.File)))))
	var rows [][]string
	var missedN, metN int
	var absent []string
	for _, s := range all {
		if s.sum == nil {
			absent = append(absent, s.name)
			continue
		}
		for _, v := range s.sum.targets() {
			switch v.outcome {
			case met:
				metN++
			case missed:
				missedN++
			}
			rows = append(rows, []string{s.name, cell(v.target), cell(v.measured), v.outcome.String()})
		}
	}
	w.table("llll", []string{"comparison", "target", "measured", "verdict"}, rows...)
	text := fmt.Sprintf("%d targets met, %d missed.", metN, missedN)
	if len(absent) > 0 {
		text += fmt.Sprintf(" No results for: %s.", strings.Join(absent, ", "))
	}
	w.para(text)
}

// readingFile is the hand-written reading of the last full run's figures,
// in the results directory beside the raw output it explains.
const readingFile = "reading.md"

// writeReading writes the results directory's reading of the figures,
// when it has one, under its own heading. Its text is prose a person
// wrote about the figures, so it is kept out of the generated tables and
// updated with the raw output it speaks of.
func (r *Report) writeReading(w *markdown) error {
	text, err := os.ReadFile(filepath.Join(r.Results, readingFile))
	if os.IsNotExist(err) {
		return nil
	} else if err != nil {
		return err
	}
	w.heading(2, "Reading the figures")
	w.para(strings.TrimSpace(string(text)))
	return nil
}

func (r *Report) writeSection(w *markdown, s section) {
	if s.sum == nil {
		c, _ := comparisonNamed(s.name)
		w.heading(2, strings.ToUpper(c.name[:1])+c.name[1:])
		w.para(fmt.Sprintf("No results: `%s` wrote no `%s`.", s.script, r.rawName(c)))
		r.writeExtra(w, s)
		return
	}
	w.heading(2, s.sum.title())
	var links []string
	for _, f := range s.files {
		links = append(links, r.link(f))
	}
	text := fmt.Sprintf("From %s, written by `scripts/bench/%s`.", strings.Join(links, ", "), s.script)
	if s.note != "" {
		text += fmt.Sprintf(" **Note: %s.**", s.note)
	}
	w.para(text)
	s.sum.intro(w)
	r.writeExtra(w, s)
	// The title is a level-2 heading here: the sections go one below.
	w.shift = 1
	s.sum.body(w)
	w.shift = 0
}

// writeExtra writes the plots and tables that the report adds to the
// summary of s.
func (r *Report) writeExtra(w *markdown, s section) {
	switch s.name {
	case "matcher":
		r.matcherPlots(w)
	case "broker":
		r.brokerSweeps(w, s.files)
	}
}

// Broker benchmark names of the two memory scenarios, with the broker and
// the count swept.
var (
	idleRE = regexp.MustCompile(`^Broker/([^/]+)/idle-(\d+)conns-\d+subs$`)
	subsRE = regexp.MustCompile(`^Broker/([^/]+)/subs-\d+conns-(\d+)subs$`)
)

// brokerSweeps writes the memory scenarios at every size measured: the
// broker run's own, in broker, and bench-all.sh's sweeps
// (results/sweep-*.txt).
func (r *Report) brokerSweeps(w *markdown, broker []string) {
	set := newSamples()
	files := append(slices.Clone(broker), r.glob("sweep-*-"+r.Arch+".txt", r.Quick)...)
	for _, f := range files {
		raw, err := readRaw(f)
		if err != nil {
			r.Warnings = append(r.Warnings, err.Error())
			continue
		}
		for _, res := range raw.results {
			set.add(res)
		}
	}
	subs, conns := collect(set, subsRE), collect(set, idleRE)
	runs := 0
	for _, name := range set.names {
		if subsRE.MatchString(name) || idleRE.MatchString(name) {
			runs = max(runs, len(set.vals[name]["rss-MiB"]))
		}
	}

	w.heading(3, "Against the number of subscriptions and connections")
	if len(files) == 0 {
		w.para("No results: neither the broker run nor the sweeps of `bench-all.sh` wrote raw output.")
		return
	}
	var links []string
	for _, f := range files {
		links = append(links, r.link(f))
	}
	w.para(fmt.Sprintf("The two memory scenarios of the broker run, repeated by `bench-all.sh` at more sizes (`SCENARIOS=\"idle subs\"` with other `CONNS` and `SUBS`), "+
		"each on a freshly started broker: `subs`, N distinct subscriptions (15%% with wildcards) over 100 connections; `idle`, N idle connections with 5 subscriptions each. "+
		"RSS is the broker's whole resident set once they are set up; the rates are how fast the broker set them up "+
		"(subscriptions, or connections with their subscriptions, per second). %s Raw output: %s.", repetitions(runs), strings.Join(links, ", ")))

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
		w.para(r.plot("broker-"+k.file+"-rss.svg", curvePlot(k.c, "rss-MiB",
			"Broker memory against "+k.counted, k.xlabel, "RSS, MiB", true)) + "\n" +
			r.plot("broker-"+k.file+"-throughput.svg", curvePlot(k.c, k.rateUnit,
				k.title, k.xlabel, k.rateText, false)))
		writeCurveTable(w, k.c, k.counted, "rss-MiB", "RSS, MiB", false)
		writeCurveTable(w, k.c, k.counted, k.perUnit, k.perText, false)
		writeCurveTable(w, k.c, k.counted, k.rateUnit, k.rateText, true)
	}
}

// matcherFamilyRE picks the workload family the matcher plots follow
// across sizes: 10% wildcards, distinct prefixes, depth 5, no fan-out.
var matcherFamilyRE = regexp.MustCompile(`^Match/impl=([^/]+)/subs=(\d+)/wild=10/prefix=distinct/depth=5/fanout=1$`)

// matcherPlots writes the matcher's lookup time and memory against the
// number of subscriptions, one line per implementation and GOARCH.
func (r *Report) matcherPlots(w *markdown) {
	type archCurves struct {
		arch string
		c    curves
	}
	var all []archCurves
	for _, f := range r.glob("matcher-*.txt", r.Quick) {
		arch := strings.TrimSuffix(filepath.Base(f), ".txt")
		arch = arch[strings.LastIndex(arch, "-")+1:]
		raw, err := readRaw(f)
		if err != nil {
			r.Warnings = append(r.Warnings, err.Error())
			continue
		}
		set := newSamples()
		for _, res := range raw.results {
			set.add(res)
		}
		all = append(all, archCurves{arch, collect(set, matcherFamilyRE)})
	}
	// The host's architecture first, drawn solid; the others dashed.
	slices.SortStableFunc(all, func(a, b archCurves) int {
		return boolInt(a.arch != r.Arch) - boolInt(b.arch != r.Arch)
	})
	ns := Plot{Title: "Matcher lookup time against subscriptions", XLabel: "subscriptions (10% wildcards, distinct prefix, depth 5)",
		YLabel: "ns per lookup", LogY: true}
	mem := Plot{Title: "Matcher memory per subscription", XLabel: "subscriptions (10% wildcards, distinct prefix, depth 5)",
		YLabel: "bytes per subscription", LogY: true}
	for _, a := range all {
		for _, impl := range a.c.impls {
			name := impl + " (" + a.arch + ")"
			dashed := a.arch != r.Arch
			ns.Series = append(ns.Series, Series{Name: name, Points: a.c.points(impl, "ns/op"), Dashed: dashed})
			mem.Series = append(mem.Series, Series{Name: name, Points: a.c.points(impl, "bytes/sub"), Dashed: dashed})
		}
	}
	w.heading(3, "Against the number of subscriptions")
	w.para("One workload family of the tables below at every size measured (`w10% distinct d5 f1`): medians of the runs, " +
		"dashed lines for 386. Lookup time is per publish topic; memory is the heap the index adds per subscription.")
	w.para(r.plot("matcher-ns.svg", ns) + "\n" + r.plot("matcher-bytes.svg", mem))
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
