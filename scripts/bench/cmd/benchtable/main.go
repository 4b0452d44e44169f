// Command benchtable turns the raw output of the matcher benchmark
// (go test -bench Match ./matcherbench, one file per GOARCH) into a Markdown
// summary: one row per workload, the three implementations side by side,
// medians over the -count repetitions, and the rows that miss the targets.
//
// Usage:
//
//	benchtable [-o summary.md] [-peers "mod v1, mod v2"] [-go go1.x] raw-amd64.txt raw-386.txt ...
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// Targets for the fieldgate index.
const (
	speedVsMochi = 10.0 // ns/op: at least this many times faster than mochi
	speedVsNATS  = 2.0  // ... and than NATS
	memVsMochi   = 15.0 // bytes/sub at 1M subscriptions: at most 1/15 of mochi
	memVsNATS    = 6.0  // ... and 1/6 of NATS
	memTargetAt  = 1000000
)

const (
	ours  = "fieldgate"
	mochi = "mochi"
	nats  = "nats"
)

// run is the parsed output of one benchmark binary.
type run struct {
	file   string
	goarch string
	cpu    string
	rows   []string                           // workload names in first-seen order
	vals   map[string]map[string]*measurement // workload -> impl -> values
	failed []string                           // FAIL lines
}

type measurement struct {
	ns, allocs, bytesSub, hits []float64
}

var nameRE = regexp.MustCompile(`^BenchmarkMatch/impl=([^/]+)/(.+?)(-\d+)?$`)

func parse(file string, r io.Reader) (*run, error) {
	out := &run{file: file, vals: map[string]map[string]*measurement{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "goarch: "):
			out.goarch = strings.TrimSpace(strings.TrimPrefix(line, "goarch: "))
		case strings.HasPrefix(line, "cpu: "):
			out.cpu = strings.TrimSpace(strings.TrimPrefix(line, "cpu: "))
		case strings.HasPrefix(line, "--- FAIL") || strings.HasPrefix(line, "FAIL") || strings.HasPrefix(line, "panic:"):
			out.failed = append(out.failed, strings.TrimSpace(line))
		case strings.HasPrefix(line, "BenchmarkMatch/"):
			f := strings.Fields(line)
			if len(f) < 4 {
				continue
			}
			m := nameRE.FindStringSubmatch(f[0])
			if m == nil {
				continue
			}
			impl, workload := m[1], m[2]
			byImpl := out.vals[workload]
			if byImpl == nil {
				byImpl = map[string]*measurement{}
				out.vals[workload] = byImpl
				out.rows = append(out.rows, workload)
			}
			ms := byImpl[impl]
			if ms == nil {
				ms = &measurement{}
				byImpl[impl] = ms
			}
			// f[1] is the iteration count; then value/unit pairs.
			for i := 2; i+1 < len(f); i += 2 {
				v, err := strconv.ParseFloat(f[i], 64)
				if err != nil {
					return nil, fmt.Errorf("%s: bad value %q in %q", file, f[i], line)
				}
				switch f[i+1] {
				case "ns/op":
					ms.ns = append(ms.ns, v)
				case "allocs/op":
					ms.allocs = append(ms.allocs, v)
				case "bytes/sub":
					ms.bytesSub = append(ms.bytesSub, v)
				case "hits/op":
					ms.hits = append(ms.hits, v)
				}
			}
		}
	}
	return out, sc.Err()
}

// median of xs, NaN-free; ok is false when xs is empty.
func median(xs []float64) (float64, bool) {
	if len(xs) == 0 {
		return 0, false
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2], true
	}
	return (s[n/2-1] + s[n/2]) / 2, true
}

type stat struct {
	v  float64
	ok bool
}

func med(ms *measurement, pick func(*measurement) []float64) stat {
	if ms == nil {
		return stat{}
	}
	v, ok := median(pick(ms))
	return stat{v, ok}
}

func fmtNum(s stat) string {
	if !s.ok {
		return "–"
	}
	switch {
	case s.v == float64(int64(s.v)):
		return strconv.FormatInt(int64(s.v), 10)
	case s.v >= 100:
		return strconv.FormatFloat(s.v, 'f', 0, 64)
	case s.v >= 10:
		return strconv.FormatFloat(s.v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(s.v, 'f', 2, 64)
	}
}

// ratio formats peer/ours; miss marks it when it is below min (min 0: never).
func ratio(peer, our stat, min float64) (string, bool) {
	if !peer.ok || !our.ok || our.v <= 0 {
		return "–", false
	}
	r := peer.v / our.v
	s := strconv.FormatFloat(r, 'f', 1, 64) + "×"
	if r < 10 {
		s = strconv.FormatFloat(r, 'f', 2, 64) + "×"
	}
	if min > 0 && r < min {
		return "**" + s + " ✗**", true
	}
	return s, false
}

// label shortens "subs=1000000/wild=10/prefix=distinct/depth=5/fanout=1".
func label(workload string) (string, int) {
	kv := map[string]string{}
	for _, part := range strings.Split(workload, "/") {
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

func writeRun(w io.Writer, r *run) (misses []string) {
	arch := r.goarch
	if arch == "" {
		arch = "?"
	}
	fmt.Fprintf(w, "\n## GOARCH=%s\n\n", arch)
	if r.cpu != "" {
		fmt.Fprintf(w, "CPU: %s. ", r.cpu)
	}
	reps := 0
	for _, byImpl := range r.vals {
		if ms := byImpl[ours]; ms != nil {
			reps = max(reps, len(ms.ns))
		}
	}
	fmt.Fprintf(w, "Raw output: `%s`; medians of %d run(s).\n\n", r.file, reps)
	if len(r.failed) > 0 {
		fmt.Fprintf(w, "**The run reported failures:**\n\n```\n%s\n```\n\n", strings.Join(r.failed, "\n"))
		misses = append(misses, fmt.Sprintf("%s: benchmark run failed (%s)", arch, r.failed[0]))
	}
	if len(r.rows) == 0 {
		fmt.Fprintf(w, "No benchmark results.\n")
		return append(misses, arch+": no results")
	}
	fmt.Fprintln(w, "| workload | hits/op | fieldgate ns/op | mochi ns/op | nats ns/op | mochi/fg speed | nats/fg speed | allocs/op fg / mochi / nats | fieldgate B/sub | mochi B/sub | nats B/sub | mochi/fg mem | nats/fg mem | misses |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|:-:|--:|--:|--:|--:|--:|---|")
	for _, wl := range r.rows {
		byImpl := r.vals[wl]
		lbl, subs := label(wl)
		ns := func(p *measurement) []float64 { return p.ns }
		al := func(p *measurement) []float64 { return p.allocs }
		bs := func(p *measurement) []float64 { return p.bytesSub }
		hi := func(p *measurement) []float64 { return p.hits }
		fgNs, moNs, naNs := med(byImpl[ours], ns), med(byImpl[mochi], ns), med(byImpl[nats], ns)
		fgB, moB, naB := med(byImpl[ours], bs), med(byImpl[mochi], bs), med(byImpl[nats], bs)
		fgA := med(byImpl[ours], al)
		hits := med(byImpl[ours], hi)
		var miss []string
		rs1, m1 := ratio(moNs, fgNs, speedVsMochi)
		rs2, m2 := ratio(naNs, fgNs, speedVsNATS)
		if m1 {
			miss = append(miss, "speed vs mochi")
		}
		if m2 {
			miss = append(miss, "speed vs nats")
		}
		memMin1, memMin2 := 0.0, 0.0
		if subs >= memTargetAt {
			memMin1, memMin2 = memVsMochi, memVsNATS
		}
		rm1, m3 := ratio(moB, fgB, memMin1)
		rm2, m4 := ratio(naB, fgB, memMin2)
		if m3 {
			miss = append(miss, "memory vs mochi")
		}
		if m4 {
			miss = append(miss, "memory vs nats")
		}
		allocs := fmt.Sprintf("%s / %s / %s", fmtNum(fgA), fmtNum(med(byImpl[mochi], al)), fmtNum(med(byImpl[nats], al)))
		if fgA.ok && fgA.v > 0 {
			allocs = "**" + allocs + " ✗**"
			miss = append(miss, "allocs")
		}
		if !fgNs.ok || !moNs.ok || !naNs.ok {
			miss = append(miss, "incomplete")
		}
		missCell := "ok"
		if len(miss) > 0 {
			missCell = "✗ " + strings.Join(miss, ", ")
			misses = append(misses, fmt.Sprintf("%s %s: %s", arch, lbl, strings.Join(miss, ", ")))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			lbl, fmtNum(hits), fmtNum(fgNs), fmtNum(moNs), fmtNum(naNs), rs1, rs2, allocs,
			fmtNum(fgB), fmtNum(moB), fmtNum(naB), rm1, rm2, missCell)
	}
	return misses
}

func main() {
	out := flag.String("o", "", "also write the summary to this file")
	peers := flag.String("peers", "", "peer module versions, for the header")
	goVersion := flag.String("go", runtime.Version(), "Go version, for the header")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: benchtable [-o summary.md] [-peers ...] raw-output.txt ...")
		os.Exit(2)
	}
	var runs []*run
	for _, name := range flag.Args() {
		f, err := os.Open(name)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		r, err := parse(name, f)
		f.Close()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		runs = append(runs, r)
	}
	var sb strings.Builder
	render(&sb, runs, *goVersion, *peers)
	fmt.Print(sb.String())
	if *out != "" {
		if err := os.WriteFile(*out, []byte(sb.String()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}

func render(w io.Writer, runs []*run, goVersion, peers string) {
	fmt.Fprintln(w, "# Subscription matcher: fieldgate vs mochi-mqtt vs NATS")
	fmt.Fprintln(w)
	cpu := ""
	var arches []string
	for _, r := range runs {
		if cpu == "" {
			cpu = r.cpu
		}
		arches = append(arches, r.goarch)
	}
	fmt.Fprintf(w, "- CPU: %s\n", orUnknown(cpu))
	fmt.Fprintf(w, "- Go: %s\n", goVersion)
	fmt.Fprintf(w, "- GOARCH: %s\n", strings.Join(arches, ", "))
	if peers != "" {
		fmt.Fprintf(w, "- Peers: %s\n", peers)
	}
	fmt.Fprintf(w, "- Targets for fieldgate: ns/op ≥ %.0f× faster than mochi and ≥ %.0f× faster than nats; "+
		"at %d subscriptions bytes/sub ≤ 1/%.0f of mochi and ≤ 1/%.0f of nats; 0 allocs/op. "+
		"Ratios are peer ÷ fieldgate (higher is better for fieldgate); a miss is in bold with ✗.\n",
		speedVsMochi, speedVsNATS, memTargetAt, memVsMochi, memVsNATS)
	fmt.Fprintln(w, "- Workload: `1M w10% distinct d5 f10k` = 1,000,000 subscriptions, 10% wildcards, "+
		"distinct first level, depth 5, 10k extra sessions on one hot topic; hits/op = sessions matched per topic on average.")
	var misses []string
	for _, r := range runs {
		misses = append(misses, writeRun(w, r)...)
	}
	fmt.Fprintln(w)
	if len(misses) == 0 {
		fmt.Fprintln(w, "All rows meet the targets.")
		return
	}
	fmt.Fprintf(w, "### Rows missing targets (%d)\n\n", len(misses))
	for _, m := range misses {
		fmt.Fprintf(w, "- %s\n", m)
	}
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
