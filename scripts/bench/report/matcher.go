package report

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/fieldgate/fieldgate/scripts/bench/targets"
)

// The implementations of the matcher comparison, as BenchmarkMatch names
// them.
const (
	mochi = "mochi"
	nats  = "nats"
)

var matchNameRE = regexp.MustCompile(`^Match/impl=([^/]+)/(.+)$`)

// matcherSummary is the matcher comparison (bench-matcher.sh): one table
// per GOARCH of lookup time, allocations and memory per subscription of
// fieldgate's index, mochi's TopicsIndex and the NATS sublist, every
// workload row judged against the targets.
type matcherSummary struct {
	goVersion string
	peers     string
	runs      []matcherRun
}

// matcherRun is the output of one benchmark binary: one GOARCH.
type matcherRun struct {
	file     string
	goarch   string
	cpu      string
	reps     int // runs of each row
	failures []string
	rows     []matcherRow
}

// arch names the run's GOARCH, "?" when the output does not say.
func (r matcherRun) arch() string {
	if r.goarch == "" {
		return "?"
	}
	return r.goarch
}

// matcherRow is one workload: its label, its table cells and the verdict
// of each matcher target on it.
type matcherRow struct {
	label  string
	cells  []string
	checks [len(matcherTargets)]check
	misses []string
}

// check is one target judged on one row.
type check struct {
	v      float64 // the ratio, or fieldgate's allocations
	judged bool    // the row has a figure for this target
	miss   bool
}

// matcherTarget is one target of the matcher, judged on every row it
// applies to and summed up over the rows in the headline.
type matcherTarget struct {
	text   string
	miss   string // how the misses column names a miss
	allocs bool   // allocations, where the most is the worst, not the least
}

// allocsTarget is the index of the allocations in matcherTargets.
const allocsTarget = 4

var matcherTargets = [...]matcherTarget{
	{text: fmt.Sprintf("lookup (ns/op) ≥ %s× faster than mochi's TopicsIndex, every workload", constant(targets.MatchSpeedVsMochi)), miss: "speed vs mochi"},
	{text: fmt.Sprintf("lookup (ns/op) ≥ %s× faster than the NATS sublist, every workload", constant(targets.MatchSpeedVsNATS)), miss: "speed vs nats"},
	{text: fmt.Sprintf("bytes/sub ≤ 1/%s of mochi's at %s subscriptions", constant(targets.MatchMemoryVsMochi), siLabel(targets.MatchMemoryAt)), miss: "memory vs mochi"},
	{text: fmt.Sprintf("bytes/sub ≤ 1/%s of the NATS sublist's at %s subscriptions", constant(targets.MatchMemoryVsNATS), siLabel(targets.MatchMemoryAt)), miss: "memory vs nats"},
	{text: fmt.Sprintf("%d allocations per lookup", targets.MatchMaxAllocs), miss: "allocs", allocs: true},
}

// newMatcherSummary reads one raw file per GOARCH. The Go version and the
// peers' versions come from the files' "go", "mochi" and "nats" lines, or
// from record, bench-all.sh's record of the run, for files without them.
func newMatcherSummary(files []*rawFile, record meta) matcherSummary {
	s := matcherSummary{}
	pick := func(key string) string {
		for _, f := range files {
			if v := f.meta.get(key); v != "" {
				return v
			}
		}
		return record.get(key)
	}
	s.goVersion = orUnknown(pick("go"))
	var peers []string
	for _, k := range []string{mochi, nats} {
		if v := pick(k); v != "" {
			peers = append(peers, v)
		}
	}
	s.peers = strings.Join(peers, ", ")
	for _, f := range files {
		s.runs = append(s.runs, newMatcherRun(f))
	}
	return s
}

func newMatcherRun(f *rawFile) matcherRun {
	r := matcherRun{file: f.name, goarch: f.meta.get("goarch"), cpu: f.meta.get("cpu"), failures: f.failures}
	var workloads []string
	impls := map[string]*samples{} // workload -> its results, by implementation
	for _, res := range f.results {
		m := matchNameRE.FindStringSubmatch(res.name)
		if m == nil {
			continue
		}
		s := impls[m[2]]
		if s == nil {
			s = newSamples()
			impls[m[2]] = s
			workloads = append(workloads, m[2])
		}
		s.add(result{name: m[1], values: res.values})
	}
	for _, wl := range workloads {
		r.reps = max(r.reps, len(impls[wl].vals[ours]["ns/op"]))
		r.rows = append(r.rows, matcherRowOf(wl, impls[wl]))
	}
	return r
}

// stat is a median that may be missing.
type stat struct {
	v  float64
	ok bool
}

func (s stat) String() string {
	if !s.ok {
		return "–"
	}
	return plain(s.v)
}

func matcherRowOf(workload string, s *samples) matcherRow {
	med := func(impl, unit string) stat {
		v, ok := s.median(impl, unit)
		return stat{v, ok}
	}
	label, subs := workloadLabel(workload)
	row := matcherRow{label: label}
	fgNs, moNs, naNs := med(ours, "ns/op"), med(mochi, "ns/op"), med(nats, "ns/op")
	fgB, moB, naB := med(ours, "bytes/sub"), med(mochi, "bytes/sub"), med(nats, "bytes/sub")
	fgA := med(ours, "allocs/op")
	memMochi, memNATS := 0.0, 0.0
	if subs >= targets.MatchMemoryAt {
		memMochi, memNATS = targets.MatchMemoryVsMochi, targets.MatchMemoryVsNATS
	}
	ratios := []struct {
		peer, our stat
		least     float64 // 0: shown, not judged
	}{
		{moNs, fgNs, targets.MatchSpeedVsMochi},
		{naNs, fgNs, targets.MatchSpeedVsNATS},
		{moB, fgB, memMochi},
		{naB, fgB, memNATS},
	}
	ratioCells := make([]string, len(ratios))
	for i, q := range ratios {
		if !q.peer.ok || !q.our.ok || q.our.v <= 0 {
			ratioCells[i] = "–"
			continue
		}
		r := q.peer.v / q.our.v
		ratioCells[i] = ratio(r)
		if q.least > 0 {
			row.checks[i] = check{v: r, judged: true, miss: r < q.least}
			if r < q.least {
				ratioCells[i] = "**" + ratioCells[i] + " ✗**"
			}
		}
	}
	allocs := fmt.Sprintf("%s / %s / %s", fgA, med(mochi, "allocs/op"), med(nats, "allocs/op"))
	if fgA.ok {
		row.checks[allocsTarget] = check{v: fgA.v, judged: true, miss: fgA.v > targets.MatchMaxAllocs}
		if row.checks[allocsTarget].miss {
			allocs = "**" + allocs + " ✗**"
		}
	}
	for i, c := range row.checks {
		if c.miss {
			row.misses = append(row.misses, matcherTargets[i].miss)
		}
	}
	if !fgNs.ok || !moNs.ok || !naNs.ok {
		row.misses = append(row.misses, "incomplete")
	}
	missCell := "ok"
	if len(row.misses) > 0 {
		missCell = "✗ " + strings.Join(row.misses, ", ")
	}
	row.cells = []string{label, med(ours, "hits/op").String(), fgNs.String(), moNs.String(), naNs.String(),
		ratioCells[0], ratioCells[1], allocs, fgB.String(), moB.String(), naB.String(), ratioCells[2], ratioCells[3], missCell}
	return row
}

// workloadLabel shortens "subs=1000000/wild=10/prefix=distinct/depth=5/fanout=1"
// to "1M w10% distinct d5 f1", and returns the number of subscriptions.
func workloadLabel(workload string) (string, int) {
	kv := map[string]string{}
	for part := range strings.SplitSeq(workload, "/") {
		k, v, _ := strings.Cut(part, "=")
		kv[k] = v
	}
	subs, _ := strconv.Atoi(kv["subs"])
	n := kv["subs"]
	switch {
	case subs >= 1000000 && subs%1000000 == 0:
		n = strconv.Itoa(subs/1000000) + "M"
	case subs >= 1000 && subs%1000 == 0:
		n = strconv.Itoa(subs/1000) + "k"
	}
	fan := kv["fanout"]
	if f, err := strconv.Atoi(fan); err == nil && f >= 1000 && f%1000 == 0 {
		fan = strconv.Itoa(f/1000) + "k"
	}
	return fmt.Sprintf("%s w%s%% %s d%s f%s", n, kv["wild"], kv["prefix"], kv["depth"], fan), subs
}

func (s matcherSummary) title() string {
	return "Subscription matcher: fieldgate vs mochi-mqtt vs NATS"
}

func (s matcherSummary) intro(w *markdown) {
	cpu := ""
	var arches []string
	for _, r := range s.runs {
		if cpu == "" {
			cpu = r.cpu
		}
		arches = append(arches, r.goarch)
	}
	items := []string{
		"CPU: " + orUnknown(cpu),
		"Go: " + s.goVersion,
		"GOARCH: " + strings.Join(arches, ", "),
	}
	if s.peers != "" {
		items = append(items, "Peers: "+s.peers)
	}
	items = append(items,
		fmt.Sprintf("Targets for fieldgate: ns/op ≥ %s× faster than mochi and ≥ %s× faster than nats; "+
			"at %d subscriptions bytes/sub ≤ 1/%s of mochi and ≤ 1/%s of nats; %d allocs/op. "+
			"Ratios are peer ÷ fieldgate (higher is better for fieldgate); a miss is in bold with ✗.",
			constant(targets.MatchSpeedVsMochi), constant(targets.MatchSpeedVsNATS), targets.MatchMemoryAt,
			constant(targets.MatchMemoryVsMochi), constant(targets.MatchMemoryVsNATS), targets.MatchMaxAllocs),
		"Workload: `1M w10% distinct d5 f10k` = 1,000,000 subscriptions, 10% wildcards, "+
			"distinct first level, depth 5, 10k extra sessions on one hot topic; hits/op = sessions matched per topic on average.")
	w.list(items...)
}

func (s matcherSummary) body(w *markdown) {
	var misses []string
	for _, r := range s.runs {
		arch := r.arch()
		w.heading(2, "GOARCH="+arch)
		text := ""
		if r.cpu != "" {
			text = "CPU: " + r.cpu + ". "
		}
		w.para(text + fmt.Sprintf("Raw output: `%s`; medians of %d run(s).", r.file, r.reps))
		if len(r.failures) > 0 {
			w.para("**The run reported failures:**")
			w.para("```\n" + strings.Join(r.failures, "\n") + "\n```")
			misses = append(misses, fmt.Sprintf("%s: benchmark run failed (%s)", arch, r.failures[0]))
		}
		if len(r.rows) == 0 {
			w.para("No benchmark results.")
			misses = append(misses, arch+": no results")
			continue
		}
		rows := make([][]string, len(r.rows))
		for i, row := range r.rows {
			rows[i] = row.cells
			if len(row.misses) > 0 {
				misses = append(misses, fmt.Sprintf("%s %s: %s", arch, row.label, strings.Join(row.misses, ", ")))
			}
		}
		w.table("lrrrrrrcrrrrrl", []string{"workload", "hits/op", "fieldgate ns/op", "mochi ns/op", "nats ns/op",
			"mochi/fg speed", "nats/fg speed", "allocs/op fg / mochi / nats", "fieldgate B/sub", "mochi B/sub", "nats B/sub",
			"mochi/fg mem", "nats/fg mem", "misses"}, rows...)
	}
	if len(misses) == 0 {
		w.para("All rows meet the targets.")
		return
	}
	w.heading(3, fmt.Sprintf("Rows missing targets (%d)", len(misses)))
	w.list(misses...)
}

// targets sums up each target over every row of every GOARCH: met when
// no row misses it, with the worst row of each GOARCH.
func (s matcherSummary) targets() []verdict {
	var out []verdict
	for i, t := range matcherTargets {
		v := verdict{target: t.text, outcome: met}
		var parts []string
		for _, r := range s.runs {
			if len(r.rows) == 0 {
				continue
			}
			part, judgedRows, misses := r.judge(i)
			parts = append(parts, part)
			switch {
			case misses > 0:
				v.outcome = missed
			case judgedRows == 0 && v.outcome != missed:
				v.outcome = unjudged
			}
		}
		if len(parts) == 0 {
			v.outcome = unjudged
			parts = []string{"no results"}
		}
		v.measured = strings.Join(parts, "; ")
		out = append(out, v)
	}
	return out
}

// judge sums up target i over the rows of r: the worst row, and how many
// rows were judged and missed.
func (r matcherRun) judge(i int) (text string, judgedRows, misses int) {
	t := matcherTargets[i]
	var worst check
	worstRow := ""
	for _, row := range r.rows {
		c := row.checks[i]
		if !c.judged {
			continue
		}
		judgedRows++
		if c.miss {
			misses++
		}
		if worstRow == "" || (t.allocs && c.v > worst.v) || (!t.allocs && c.v < worst.v) {
			worst, worstRow = c, row.label
		}
	}
	if judgedRows == 0 {
		return r.arch() + ": no rows to judge", 0, 0
	}
	missedText := "none missed"
	if misses > 0 {
		missedText = fmt.Sprintf("**%d of %d workloads missed**", misses, judgedRows)
	}
	switch {
	case t.allocs && worst.v == 0:
		return fmt.Sprintf("%s: 0 in all %d workloads", r.arch(), judgedRows), judgedRows, misses
	case t.allocs:
		return fmt.Sprintf("%s: up to %s (%s), %s", r.arch(), number(worst.v), worstRow, missedText), judgedRows, misses
	}
	return fmt.Sprintf("%s: lowest %s (%s), %s", r.arch(), ratio(worst.v), worstRow, missedText), judgedRows, misses
}
