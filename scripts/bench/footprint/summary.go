package footprint

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Raw is the parsed raw output of one bench-footprint.sh run.
type Raw struct {
	header  map[string]string // "key: value" lines; the first value of each key
	release []string          // the release build commands, as make prints them
	sizes   []record          // "size" lines: release binaries
	debs    []record          // "deb" lines: packages found in bin/
	runners map[string]string // label -> how the binary was run
	rss     []record          // "rss" lines, one per binary
	// bench holds the BenchmarkFootprint figures: binary (armv6, 386...)
	// -> sub-benchmark -> unit -> one value per run.
	bench    map[string]map[string]map[string][]float64
	problems []string // "# warn" and "# skip" lines
}

// record is a raw line of the form KIND LABEL key=value...
type record struct {
	label string
	kv    map[string]string
}

func (r record) num(key string) (float64, bool) {
	v, err := strconv.ParseFloat(r.kv[key], 64)
	return v, err == nil
}

// Parse reads the raw output of bench-footprint.sh.
func Parse(r io.Reader) (*Raw, error) {
	raw := &Raw{header: map[string]string{}, runners: map[string]string{}, bench: map[string]map[string]map[string][]float64{}}
	// Benchmark lines belong to the binary named by the last "heap-binary"
	// line, or without one to the last "goarch" line of go test.
	binary, goarch := "", ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		kind, rest, _ := strings.Cut(line, " ")
		switch {
		case line == "":
		case strings.HasPrefix(line, "# warn ") || strings.HasPrefix(line, "# skip "):
			raw.problems = append(raw.problems, strings.TrimPrefix(line, "# "))
		case line[0] == '#':
		case kind == "size" || kind == "deb" || kind == "rss":
			rec := parseRecord(rest)
			switch kind {
			case "size":
				raw.sizes = append(raw.sizes, rec)
			case "deb":
				raw.debs = append(raw.debs, rec)
			default:
				raw.rss = append(raw.rss, rec)
			}
		case kind == "runner":
			label, how, _ := strings.Cut(rest, " ")
			raw.runners[label] = how
		case kind == "sample":
		case strings.HasPrefix(line, "BenchmarkFootprint/"):
			if err := raw.addBench(cmp.Or(binary, goarch), line); err != nil {
				return nil, err
			}
		default:
			key, val, ok := strings.Cut(line, ": ")
			if !ok {
				continue // the test binary's PASS and ok lines
			}
			switch key {
			case "goarch":
				goarch = val
			case "heap-binary":
				binary = val
				continue
			case "release":
				raw.release = append(raw.release, val)
				continue
			}
			if _, seen := raw.header[key]; !seen {
				raw.header[key] = val
			}
		}
	}
	return raw, sc.Err()
}

func parseRecord(s string) record {
	f := strings.Fields(s)
	rec := record{kv: map[string]string{}}
	if len(f) == 0 {
		return rec
	}
	rec.label = f[0]
	for _, kv := range f[1:] {
		if k, v, ok := strings.Cut(kv, "="); ok {
			rec.kv[k] = v
		}
	}
	return rec
}

// addBench records a Go benchmark line of binary: the name, the
// iterations, then value and unit pairs.
func (raw *Raw) addBench(binary, line string) error {
	f := strings.Fields(line)
	if len(f) < 2 || len(f)%2 != 0 {
		return fmt.Errorf("footprint: malformed benchmark line %q", line)
	}
	name := strings.TrimPrefix(f[0], "BenchmarkFootprint/")
	if i := strings.LastIndexByte(name, '-'); i > 0 {
		if _, err := strconv.Atoi(name[i+1:]); err == nil {
			name = name[:i] // the GOMAXPROCS suffix
		}
	}
	if binary == "" {
		return fmt.Errorf("footprint: benchmark line before any heap-binary or goarch line: %q", line)
	}
	byName := raw.bench[binary]
	if byName == nil {
		byName = map[string]map[string][]float64{}
		raw.bench[binary] = byName
	}
	units := byName[name]
	if units == nil {
		units = map[string][]float64{}
		byName[name] = units
	}
	for i := 2; i+1 < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return fmt.Errorf("footprint: benchmark line %q: %w", line, err)
		}
		units[f[i+1]] = append(units[f[i+1]], v)
	}
	return nil
}

// Summarize writes the Markdown section of raw, named by rawName in its
// text, to w.
func Summarize(w io.Writer, raw *Raw, rawName string) error {
	var b strings.Builder
	h := raw.header
	b.WriteString("## ARM footprint\n\n")
	fmt.Fprintf(&b, "- Machine: %s, %s cores, %s/%s; the ARM binaries run under QEMU user-mode emulation.\n",
		or(h["cpu"]), or(h["cores"]), or(h["goos"]), or(h["goarch"]))
	fmt.Fprintf(&b, "- Go: %s; fieldgate: %s\n", or(h["go"]), or(h["fieldgate"]))
	if q := h["qemu"]; q != "" {
		fmt.Fprintf(&b, "- QEMU: %s\n", q)
	}
	fmt.Fprintf(&b, "- Settings: %s; run %s\n", or(h["settings"]), or(h["date"]))
	if h["loadavg-start"] != "" {
		fmt.Fprintf(&b, "- Load average (1, 5, 15 min) at start: %s; at end: %s. Other work on the machine shows in the timings, hardly in the memory figures.\n",
			h["loadavg-start"], or(h["loadavg-end"]))
	}
	fmt.Fprintf(&b, "- Raw output: `%s`; `scripts/bench/bench-footprint.sh` made it.\n\n", rawName)

	writeSizes(&b, raw)
	writeHeap(&b, raw)
	writeRSS(&b, raw)

	if len(raw.problems) > 0 {
		b.WriteString("### Problems in this run\n\n")
		for _, p := range raw.problems {
			fmt.Fprintf(&b, "- %s\n", p)
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writeSizes(b *strings.Builder, raw *Raw) {
	b.WriteString("### Binary sizes\n\n")
	if len(raw.sizes) == 0 {
		b.WriteString("No binaries were built.\n\n")
		return
	}
	b.WriteString("The release binaries, built with the commands `make cross` and `make deb` run (static, no cgo, `-trimpath -ldflags \"-s -w\"`: no symbol table or DWARF). " +
		"The 386 binary is not released; it is built the same way to set its size beside the 32-bit ARM ones.\n\n")
	b.WriteString("| binary | target | bytes | MiB |\n|---|---|--:|--:|\n")
	for _, s := range raw.sizes {
		n, _ := s.num("bytes")
		target := s.kv["goos"] + "/" + s.kv["goarch"]
		if v := s.kv["goarm"]; v != "" {
			target += ", GOARM=" + v
		}
		fmt.Fprintf(b, "| `%s` | %s | %s | %.2f |\n", s.kv["file"], target, thousands(n), n/(1<<20))
	}
	b.WriteString("\n")
	if len(raw.debs) > 0 {
		b.WriteString("Packages found in `bin/`, from the last `make deb` (this script does not build them, so they may predate the tree measured here; the version is in the name). " +
			"A package is compressed, which is about what an update download costs.\n\n")
		b.WriteString("| package | bytes | MiB |\n|---|--:|--:|\n")
		for _, d := range raw.debs {
			n, _ := d.num("bytes")
			fmt.Fprintf(b, "| `%s` | %s | %.2f |\n", d.label, thousands(n), n/(1<<20))
		}
		b.WriteString("\n")
	}
}

// heapRow is one row of the heap table: a figure of one sub-benchmark.
type heapRow struct {
	label string
	bench string
	unit  string
	scale float64 // the figure times scale is shown
	dec   int     // decimals shown
	unitN string  // unit shown after the figure
}

func writeHeap(b *strings.Builder, raw *Raw) {
	b.WriteString("### Memory per connection and per subscription\n\n")
	arches := slices.Sorted(maps.Keys(raw.bench))
	// Each stand-in beside the ARM binary it stands in for.
	slices.SortStableFunc(arches, func(x, y string) int { return cmp.Compare(archRank(x), archRank(y)) })
	if len(arches) == 0 {
		b.WriteString("Not measured in this run.\n\n")
		return
	}
	var rows []heapRow
	perConn := "" // subscriptions per connection, for the text
	names := map[string]bool{}
	for _, a := range arches {
		for n := range raw.bench[a] {
			names[n] = true
		}
	}
	for _, n := range slices.Sorted(maps.Keys(names)) {
		if conns, ok := strings.CutPrefix(n, "conns="); ok {
			c, _ := strconv.ParseFloat(conns, 64)
			rows = append(rows,
				heapRow{"heap per idle connection", n, "heap-B/conn", 1, 0, "B"},
				heapRow{"goroutine stacks per idle connection", n, "stack-B/conn", 1, 0, "B"},
				heapRow{"goroutines per idle connection", n, "goroutines/conn", 1, 2, ""},
				heapRow{thousands(c) + " idle connections: heap + stacks", n, "total-B/conn", c / (1 << 20), 1, "MiB"},
			)
		}
		if rest, ok := strings.CutPrefix(n, "subs="); ok {
			subs, conns, _ := strings.Cut(rest, "/conns=")
			s, _ := strconv.ParseFloat(subs, 64)
			if c, err := strconv.ParseFloat(conns, 64); err == nil && c > 0 {
				perConn = thousands(s/c) + " per connection"
			}
			rows = append(rows,
				heapRow{"heap per subscription", n, "heap-B/sub", 1, 0, "B"},
				heapRow{thousands(s) + " subscriptions: heap", n, "heap-B/sub", s / (1 << 20), 1, "MiB"},
			)
		}
	}
	fmt.Fprintf(b, "`BenchmarkFootprint` in `gateway/broker` (`footprint_bench_test.go`), built for each binary, every run in a fresh process; the median, with the lowest and highest run in brackets when there were several. "+
		"386 and amd64 run natively; armv6 and arm64 are the ARM builds themselves under QEMU user-mode emulation, which emulates the instructions, not the Go runtime: the heap and stacks are the guest's own, as on a board. "+
		"The broker runs with the released defaults (`read_buffer` 1 KiB, `write_buffer` 4 KiB lent only while writing) but without `$SYS` publishing; "+
		"the clients are real MQTT 3.1.1 clients over loopback TCP (clean sessions, no keepalive) in a second process, so none of their memory is counted. "+
		"Before a baseline the broker has seen one connection and one subscription come and go. "+
		"The figure is the growth of the live heap (`HeapAlloc` after two `runtime.GC`) and of the goroutine stacks (`StackInuse`) from the baseline, divided by the connections or subscriptions.\n\n")
	b.WriteString("| figure |")
	for _, a := range arches {
		runs := 0
		for _, units := range raw.bench[a] {
			runs = max(runs, len(units["heap-B/conn"]), len(units["heap-B/sub"]))
		}
		how := "native"
		if r := raw.runners[a]; r != "" && r != "native" {
			how = "QEMU"
		}
		fmt.Fprintf(b, " %s, %s, %s |", a, how, plural(runs, "run"))
	}
	b.WriteString("\n|---|")
	for range arches {
		b.WriteString("--:|")
	}
	b.WriteString("\n")
	for _, r := range rows {
		fmt.Fprintf(b, "| %s |", r.label)
		for _, a := range arches {
			vals := raw.bench[a][r.bench][r.unit]
			if r.unit == "total-B/conn" {
				vals = addEach(raw.bench[a][r.bench]["heap-B/conn"], raw.bench[a][r.bench]["stack-B/conn"])
			}
			fmt.Fprintf(b, " %s |", spread(vals, r.scale, r.dec, r.unitN))
		}
		b.WriteString("\n")
	}
	b.WriteString("\n" +
		"- **Connection**: what the broker holds for a connected client that does nothing: its connection and session state, the 1 KiB read buffer, the socket's `net.Conn`, " +
		"and one goroutine (the reader; a writer goroutine exists only while there is something to write). " +
		"Not counted: the kernel's socket buffers, which are kernel memory and appear in no process's RSS; the runtime's bookkeeping outside the heap (the poller's entry for the socket, span and collector metadata), which RSS includes; and the client's own memory.\n")
	fmt.Fprintf(b, "- **Subscription**: the index entry and the session's record of the filter, for distinct filters of four or five levels, 10%% with a `+` and 5%% ending in `#`, "+
		"%s (the shapes of `bench-broker.sh`'s subscription scenario); the growth is measured after the connections are set up, so it holds the subscriptions alone. "+
		"Shorter or more shared filters cost less, deeper ones more, and since the index's hash tables and the sessions' maps grow by doubling, the figure per subscription moves with the count, by a fifth or so.\n",
		cmp.Or(perConn, "spread over the connections"))
	b.WriteString("- **386 stands in for ARMv6/v7, amd64 for ARM64**: the heap layout follows the pointer size and alignment, which 386 shares with 32-bit ARM and amd64 with arm64, and goroutine stacks grow alike; " +
		"the stand-ins run natively, in seconds, where the emulated ARM binaries take many times as long. Where both columns are there, compare them to see how good a stand-in is.\n" +
		"- A Go process's RSS is larger than heap plus stacks: the heap grows to about twice the live heap between collections (GOGC=100), and the runtime returns freed pages to the kernel gradually. " +
		"`bench-broker.sh` measures the broker's RSS per connection over TCP.\n\n")
}

func writeRSS(b *strings.Builder, raw *Raw) {
	b.WriteString("### Resident memory running the default configuration\n\n")
	if len(raw.rss) == 0 {
		b.WriteString("Not measured in this run.\n\n")
		return
	}
	secs := 0.0
	for _, r := range raw.rss {
		s, _ := r.num("seconds")
		secs = max(secs, s)
	}
	fmt.Fprintf(b, "Each release binary runs `fieldgate run` on the embedded default configuration (simulated sensors publishing, the broker, the ops endpoint) with only its ports and state file moved, for %.0f s from the moment `/readyz` answers 200; "+
		"all binaries run at the same time, each on its own ports. "+
		"Once a second the watcher reads the process's `VmRSS` from `/proc` and the gateway's own figures from `/metrics`; a subscriber to `fieldgate/#` counts the readings that arrive. "+
		"The 386 and amd64 binaries run natively beside them, for a figure without an emulator.\n\n", secs)

	b.WriteString("| binary | run by | ready after | RSS at ready | RSS max | RSS at end | peak RSS (VmHWM) | readings received |\n|---|---|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range raw.rss {
		ready, _ := r.num("ready_s")
		readings, _ := r.num("readings")
		seen, _ := r.num("sensors_seen")
		sensors, _ := r.num("sensors")
		fmt.Fprintf(b, "| %s | %s | %.1f s | %s | %s | %s | %s | %s from %.0f of %.0f sensors |\n",
			r.label, runnerOf(raw, r.label), ready, mib(r, "vmrss_start"), mib(r, "vmrss_max"), mib(r, "vmrss_end"), mib(r, "vmhwm"),
			thousands(readings), seen, sensors)
	}
	var gaps []string
	for _, pair := range [][2]string{{"armv6", "386"}, {"armv7", "386"}, {"arm64", "amd64"}} {
		emu, okE := rssOf(raw, pair[0])
		nat, okN := rssOf(raw, pair[1])
		if okE && okN {
			gaps = append(gaps, fmt.Sprintf("%s holds %.1f MiB more than %s", pair[0], (emu-nat)/(1<<20), pair[1]))
		}
	}
	if len(gaps) > 0 {
		fmt.Fprintf(b, "\nAt the end %s: most of that is QEMU (see below).\n", strings.Join(gaps, ", "))
	}
	b.WriteString("\nThe gateway's own figures, from its `/metrics`:\n\n")
	b.WriteString("| binary | process_resident_memory_bytes at end | Go heap objects at ready, max, end | GC heap goal at end | Go runtime mapped at end | goroutines | GC cycles | sensor reads |\n|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range raw.rss {
		goroutines, _ := r.num("goroutines_end")
		cycles, _ := r.num("gc_cycles")
		reads, _ := r.num("sensor_reads")
		fmt.Fprintf(b, "| %s | %s | %s, %s, %s | %s | %s | %.0f | %.0f | %s |\n",
			r.label, mib(r, "guest_rss_end"), mib(r, "heap_start"), mib(r, "heap_max"), mib(r, "heap_end"), mib(r, "heap_goal_end"), mib(r, "go_mapped_end"),
			goroutines, cycles, thousands(reads))
	}
	b.WriteString("\n" +
		"- **RSS under QEMU is the emulator's**: qemu-user runs the guest inside its own process, so `VmRSS` counts QEMU itself (its code, the translated-code cache, its own heap) besides the guest's memory and the pages of the binary it touched. " +
		"It is an upper bound for the same binary on a board; the native 386 and amd64 rows show what the gateway itself takes without an emulator. " +
		"The guest cannot tell either: `process_resident_memory_bytes` comes from `/proc/self/statm`, which QEMU passes through, so it reports the QEMU process too.\n" +
		"- **The gateway's own view** is the Go runtime's: `go_heap_objects_bytes` is the heap in objects, live or not yet swept, so it rises between collections and falls at each; " +
		"`go_memory_mapped_bytes` is all memory the runtime has mapped (heap, stacks, its own structures), including pages returned to the kernel, so it bounds the gateway's resident memory from above without the binary's code. " +
		"These figures are the guest's and hold on a board.\n" +
		"- **Readings received** counts readings (JSON with a value on `fieldgate/DEVICE/SENSOR/QUANTITY`) that reached a subscriber during the run; retained status messages are not counted. " +
		"`sensor reads` is the gateway's count of readings taken in the same time, one per sensor read, which publishes one message per quantity. " +
		"The first readings at start may come before the subscriber, and a sensor read every 60 s may fall outside a short run.\n" +
		"- **Short runs**: the collector's first goal is a 4 MiB heap, which the default configuration takes minutes to fill, so a run of a minute sees few collections or none (the GC cycles column). " +
		"RSS still rising at the end is the heap filling towards that goal, not a leak; a longer DURATION shows where it levels off.\n" +
		"- Timings (ready after) are QEMU's on a shared machine, no guide to a board's speed.\n\n")
}

func runnerOf(raw *Raw, label string) string {
	switch how := raw.runners[label]; how {
	case "":
		return "?"
	case "native":
		return how
	default:
		return "`" + how + "`"
	}
}

// mib shows the value of key in r, in bytes, as MiB.
func mib(r record, key string) string {
	v, ok := r.num(key)
	if !ok {
		return "n/a"
	}
	return fmt.Sprintf("%.1f MiB", v/(1<<20))
}

// archRank orders the binaries: 32-bit first, each stand-in before the
// ARM binaries it stands in for.
func archRank(a string) int {
	if i := slices.Index([]string{"386", "armv6", "armv7", "arm", "amd64", "arm64"}, a); i >= 0 {
		return i
	}
	return 99
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

// spread shows the median of vals times scale, and the range when there
// are several.
func spread(vals []float64, scale float64, dec int, unit string) string {
	if len(vals) == 0 {
		return "n/a"
	}
	s := slices.Clone(vals)
	slices.Sort(s)
	f := func(v float64) string { return decimal(v*scale, dec) }
	out := f(median(s))
	if unit != "" {
		out += " " + unit
	}
	if len(s) > 1 && f(s[0]) != f(s[len(s)-1]) {
		out += " (" + f(s[0]) + "–" + f(s[len(s)-1]) + ")"
	}
	return out
}

func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

func addEach(a, b []float64) []float64 {
	if len(a) != len(b) {
		return nil
	}
	out := make([]float64, len(a))
	for i := range a {
		out[i] = a[i] + b[i]
	}
	return out
}

func decimal(v float64, dec int) string {
	if dec == 0 {
		return thousands(v)
	}
	return strconv.FormatFloat(v, 'f', dec, 64)
}

// thousands rounds v to a whole number and groups its digits by three.
func thousands(v float64) string {
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func or(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// rssOf returns the RSS at the end of the run of label.
func rssOf(raw *Raw, label string) (float64, bool) {
	for _, r := range raw.rss {
		if r.label == label {
			return r.num("vmrss_end")
		}
	}
	return 0, false
}
