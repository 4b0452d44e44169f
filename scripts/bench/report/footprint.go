package report

import (
	"cmp"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// footprintSummary is the footprint (bench-footprint.sh): the release
// binaries' sizes, the broker's heap per connection and per subscription
// from BenchmarkFootprint on each binary, and the RSS of the binaries
// running the default configuration, the ARM ones under QEMU.
type footprintSummary struct {
	name    string // the raw file, as the summary names it
	meta    meta
	sizes   []record
	debs    []record
	rss     []record
	runners map[string]string // label -> how the binary was run
	// bench holds the BenchmarkFootprint figures by binary (armv6,
	// 386...): the binary a "heap-binary" line names, or without one the
	// GOARCH of go test's header.
	bench    map[string]*samples
	problems []string
}

// newFootprintSummary reads the raw output of one bench-footprint.sh run.
func newFootprintSummary(f *rawFile) footprintSummary {
	s := footprintSummary{
		name: "scripts/bench/results/" + filepath.Base(f.name), meta: f.meta,
		runners: map[string]string{}, bench: map[string]*samples{}, problems: f.problems,
	}
	for _, r := range f.records {
		switch r.kind {
		case "size":
			s.sizes = append(s.sizes, r)
		case "deb":
			s.debs = append(s.debs, r)
		case "rss":
			s.rss = append(s.rss, r)
		case "runner":
			s.runners[r.label] = r.kv["how"]
		}
	}
	for _, res := range f.results {
		name, ok := strings.CutPrefix(res.name, "Footprint/")
		if !ok {
			continue
		}
		binary := cmp.Or(res.config["heap-binary"], res.config["goarch"])
		if s.bench[binary] == nil {
			s.bench[binary] = newSamples()
		}
		s.bench[binary].add(result{name: name, values: res.values})
	}
	return s
}

// num is the value of key in r as a number.
func num(r record, key string) (float64, bool) {
	v, err := strconv.ParseFloat(r.kv[key], 64)
	return v, err == nil
}

func (s footprintSummary) title() string { return "ARM footprint" }

func (s footprintSummary) intro(w *markdown) {
	h := s.meta
	items := []string{
		fmt.Sprintf("Machine: %s, %s cores, %s/%s; the ARM binaries run under QEMU user-mode emulation.",
			orUnknown(h.get("cpu")), orUnknown(h.get("cores")), orUnknown(h.get("goos")), orUnknown(h.get("goarch"))),
		fmt.Sprintf("Go: %s; fieldgate: %s", orUnknown(h.get("go")), orUnknown(h.get("fieldgate"))),
	}
	if q := h.get("qemu"); q != "" {
		items = append(items, "QEMU: "+q)
	}
	items = append(items, fmt.Sprintf("Settings: %s; run %s", orUnknown(h.get("settings")), orUnknown(h.get("date"))))
	if h.get("loadavg-start") != "" {
		items = append(items, fmt.Sprintf("Load average (1, 5, 15 min) at start: %s; at end: %s. Other work on the machine shows in the timings, hardly in the memory figures.",
			h.get("loadavg-start"), orUnknown(h.get("loadavg-end"))))
	}
	items = append(items, fmt.Sprintf("Raw output: `%s`; `scripts/bench/bench-footprint.sh` made it.", s.name))
	w.list(items...)
}

// targets: the footprint is measured, not judged.
func (s footprintSummary) targets() []verdict { return nil }

func (s footprintSummary) body(w *markdown) {
	s.writeSizes(w)
	s.writeHeap(w)
	s.writeRSS(w)
	if len(s.problems) > 0 {
		w.heading(2, "Problems in this run")
		w.list(s.problems...)
	}
}

func (s footprintSummary) writeSizes(w *markdown) {
	w.heading(2, "Binary sizes")
	if len(s.sizes) == 0 {
		w.para("No binaries were built.")
		return
	}
	w.para("The release binaries, built with the commands `make cross` and `make deb` run (static, no cgo, `-trimpath -ldflags \"-s -w\"`: no symbol table or DWARF). " +
		"The 386 binary is not released; it is built the same way to set its size beside the 32-bit ARM ones.")
	var rows [][]string
	for _, r := range s.sizes {
		n, _ := num(r, "bytes")
		target := r.kv["goos"] + "/" + r.kv["goarch"]
		if v := r.kv["goarm"]; v != "" {
			target += ", GOARM=" + v
		}
		rows = append(rows, []string{"`" + r.kv["file"] + "`", target, thousands(n), fmt.Sprintf("%.2f", n/(1<<20))})
	}
	w.table("ll", []string{"binary", "target", "bytes", "MiB"}, rows...)
	if len(s.debs) > 0 {
		w.para("Packages found in `bin/`, from the last `make deb` (this script does not build them, so they may predate the tree measured here; the version is in the name). " +
			"A package is compressed, which is about what an update download costs.")
		rows = nil
		for _, d := range s.debs {
			n, _ := num(d, "bytes")
			rows = append(rows, []string{"`" + d.label + "`", thousands(n), fmt.Sprintf("%.2f", n/(1<<20))})
		}
		w.table("l", []string{"package", "bytes", "MiB"}, rows...)
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

func (s footprintSummary) writeHeap(w *markdown) {
	w.heading(2, "Memory per connection and per subscription")
	arches := slices.Sorted(maps.Keys(s.bench))
	// Each stand-in beside the ARM binary it stands in for.
	slices.SortStableFunc(arches, func(x, y string) int { return cmp.Compare(archRank(x), archRank(y)) })
	if len(arches) == 0 {
		w.para("Not measured in this run.")
		return
	}
	var rows []heapRow
	perConn := "" // subscriptions per connection, for the text
	names := map[string]bool{}
	for _, a := range arches {
		for _, n := range s.bench[a].names {
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
			sub, _ := strconv.ParseFloat(subs, 64)
			if c, err := strconv.ParseFloat(conns, 64); err == nil && c > 0 {
				perConn = thousands(sub/c) + " per connection"
			}
			rows = append(rows,
				heapRow{"heap per subscription", n, "heap-B/sub", 1, 0, "B"},
				heapRow{thousands(sub) + " subscriptions: heap", n, "heap-B/sub", sub / (1 << 20), 1, "MiB"},
			)
		}
	}
	w.para("`BenchmarkFootprint` in `gateway/broker` (`footprint_bench_test.go`), built for each binary, every run in a fresh process; the median, with the lowest and highest run in brackets when there were several. " +
		"386 and amd64 run natively; armv6 and arm64 are the ARM builds themselves under QEMU user-mode emulation, which emulates the instructions, not the Go runtime: the heap and stacks are the guest's own, as on a board. " +
		"The broker runs with the released defaults (`read_buffer` 1 KiB, `write_buffer` 4 KiB lent only while writing) but without `$SYS` publishing; " +
		"the clients are real MQTT 3.1.1 clients over loopback TCP (clean sessions, no keepalive) in a second process, so none of their memory is counted. " +
		"Before a baseline the broker has seen one connection and one subscription come and go. " +
		"The figure is the growth of the live heap (`HeapAlloc` after two `runtime.GC`) and of the goroutine stacks (`StackInuse`) from the baseline, divided by the connections or subscriptions.")
	head := []string{"figure"}
	for _, a := range arches {
		runs := 0
		for _, units := range s.bench[a].vals {
			runs = max(runs, len(units["heap-B/conn"]), len(units["heap-B/sub"]))
		}
		how := "native"
		if r := s.runners[a]; r != "" && r != "native" {
			how = "QEMU"
		}
		head = append(head, fmt.Sprintf("%s, %s, %s", a, how, plural(runs, "run")))
	}
	var table [][]string
	for _, r := range rows {
		cells := []string{r.label}
		for _, a := range arches {
			units := s.bench[a].vals[r.bench]
			vals := units[r.unit]
			if r.unit == "total-B/conn" {
				vals = addEach(units["heap-B/conn"], units["stack-B/conn"])
			}
			cells = append(cells, spread(vals, r.scale, r.dec, r.unitN))
		}
		table = append(table, cells)
	}
	w.table("l", head, table...)
	w.list(
		"**Connection**: what the broker holds for a connected client that does nothing: its connection and session state, the 1 KiB read buffer, the socket's `net.Conn`, "+
			"and one goroutine (the reader; a writer goroutine exists only while there is something to write). "+
			"Not counted: the kernel's socket buffers, which are kernel memory and appear in no process's RSS; the runtime's bookkeeping outside the heap (the poller's entry for the socket, span and collector metadata), which RSS includes; and the client's own memory.",
		fmt.Sprintf("**Subscription**: the index entry and the session's record of the filter, for distinct filters of four or five levels, 10%% with a `+` and 5%% ending in `#`, "+
			"%s (the shapes of `bench-broker.sh`'s subscription scenario); the growth is measured after the connections are set up, so it holds the subscriptions alone. "+
			"Shorter or more shared filters cost less, deeper ones more, and since the index's hash tables and the sessions' maps grow by doubling, the figure per subscription moves with the count, by a fifth or so.",
			cmp.Or(perConn, "spread over the connections")),
		"**386 stands in for ARMv6/v7, amd64 for ARM64**: the heap layout follows the pointer size and alignment, which 386 shares with 32-bit ARM and amd64 with arm64, and goroutine stacks grow alike; "+
			"the stand-ins run natively, in seconds, where the emulated ARM binaries take many times as long. Where both columns are there, compare them to see how good a stand-in is.",
		"A Go process's RSS is larger than heap plus stacks: the heap grows to about twice the live heap between collections (GOGC=100), and the runtime returns freed pages to the kernel gradually. "+
			"`bench-broker.sh` measures the broker's RSS per connection over TCP.",
	)
}

func (s footprintSummary) writeRSS(w *markdown) {
	w.heading(2, "Resident memory running the default configuration")
	if len(s.rss) == 0 {
		w.para("Not measured in this run.")
		return
	}
	secs := 0.0
	for _, r := range s.rss {
		v, _ := num(r, "seconds")
		secs = max(secs, v)
	}
	w.para(fmt.Sprintf("Each release binary runs `fieldgate run` on the embedded default configuration (simulated sensors publishing, the broker, the ops endpoint) with only its ports and state file moved, for %.0f s from the moment `/readyz` answers 200; "+
		"all binaries run at the same time, each on its own ports. "+
		"Once a second the watcher reads the process's `VmRSS` from `/proc` and the gateway's own figures from `/metrics`; a subscriber to `fieldgate/#` counts the readings that arrive. "+
		"The 386 and amd64 binaries run natively beside them, for a figure without an emulator.", secs))
	var rows [][]string
	for _, r := range s.rss {
		ready, _ := num(r, "ready_s")
		readings, _ := num(r, "readings")
		seen, _ := num(r, "sensors_seen")
		sensors, _ := num(r, "sensors")
		rows = append(rows, []string{r.label, s.runnerOf(r.label), fmt.Sprintf("%.1f s", ready),
			mib(r, "vmrss_start"), mib(r, "vmrss_max"), mib(r, "vmrss_end"), mib(r, "vmhwm"),
			fmt.Sprintf("%s from %.0f of %.0f sensors", thousands(readings), seen, sensors)})
	}
	w.table("ll", []string{"binary", "run by", "ready after", "RSS at ready", "RSS max", "RSS at end", "peak RSS (VmHWM)", "readings received"}, rows...)
	var gaps []string
	for _, pair := range [][2]string{{"armv6", "386"}, {"armv7", "386"}, {"arm64", "amd64"}} {
		emu, okE := s.rssAtEnd(pair[0])
		nat, okN := s.rssAtEnd(pair[1])
		if okE && okN {
			gaps = append(gaps, fmt.Sprintf("%s holds %.1f MiB more than %s", pair[0], (emu-nat)/(1<<20), pair[1]))
		}
	}
	if len(gaps) > 0 {
		w.para(fmt.Sprintf("At the end %s: most of that is QEMU (see below).", strings.Join(gaps, ", ")))
	}
	w.para("The gateway's own figures, from its `/metrics`:")
	rows = nil
	for _, r := range s.rss {
		goroutines, _ := num(r, "goroutines_end")
		cycles, _ := num(r, "gc_cycles")
		reads, _ := num(r, "sensor_reads")
		rows = append(rows, []string{r.label, mib(r, "guest_rss_end"),
			fmt.Sprintf("%s, %s, %s", mib(r, "heap_start"), mib(r, "heap_max"), mib(r, "heap_end")),
			mib(r, "heap_goal_end"), mib(r, "go_mapped_end"), fmt.Sprintf("%.0f", goroutines), fmt.Sprintf("%.0f", cycles), thousands(reads)})
	}
	w.table("l", []string{"binary", "process_resident_memory_bytes at end", "Go heap objects at ready, max, end", "GC heap goal at end",
		"Go runtime mapped at end", "goroutines", "GC cycles", "sensor reads"}, rows...)
	w.list(
		"**RSS under QEMU is the emulator's**: qemu-user runs the guest inside its own process, so `VmRSS` counts QEMU itself (its code, the translated-code cache, its own heap) besides the guest's memory and the pages of the binary it touched. "+
			"It is an upper bound for the same binary on a board; the native 386 and amd64 rows show what the gateway itself takes without an emulator. "+
			"The guest cannot tell either: `process_resident_memory_bytes` comes from `/proc/self/statm`, which QEMU passes through, so it reports the QEMU process too.",
		"**The gateway's own view** is the Go runtime's: `go_heap_objects_bytes` is the heap in objects, live or not yet swept, so it rises between collections and falls at each; "+
			"`go_memory_mapped_bytes` is all memory the runtime has mapped (heap, stacks, its own structures), including pages returned to the kernel, so it bounds the gateway's resident memory from above without the binary's code. "+
			"These figures are the guest's and hold on a board.",
		"**Readings received** counts readings (JSON with a value on `fieldgate/DEVICE/SENSOR/QUANTITY`) that reached a subscriber during the run; retained status messages are not counted. "+
			"`sensor reads` is the gateway's count of readings taken in the same time, one per sensor read, which publishes one message per quantity. "+
			"The first readings at start may come before the subscriber, and a sensor read every 60 s may fall outside a short run.",
		"**Short runs**: the collector's first goal is a 4 MiB heap, which the default configuration takes minutes to fill, so a run of a minute sees few collections or none (the GC cycles column). "+
			"RSS still rising at the end is the heap filling towards that goal, not a leak; a longer DURATION shows where it levels off.",
		"Timings (ready after) are QEMU's on a shared machine, no guide to a board's speed.",
	)
}

func (s footprintSummary) runnerOf(label string) string {
	switch how := s.runners[label]; how {
	case "":
		return "?"
	case "native":
		return how
	default:
		return "`" + how + "`"
	}
}

// rssAtEnd returns the RSS at the end of the run of label.
func (s footprintSummary) rssAtEnd(label string) (float64, bool) {
	for _, r := range s.rss {
		if r.label == label {
			return num(r, "vmrss_end")
		}
	}
	return 0, false
}

// mib shows the value of key in r, in bytes, as MiB.
func mib(r record, key string) string {
	v, ok := num(r, key)
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

// spread shows the median of vals times scale, and the range when there
// are several.
func spread(vals []float64, scale float64, dec int, unit string) string {
	mid, ok := median(vals)
	if !ok {
		return "n/a"
	}
	lo, hi := slices.Min(vals), slices.Max(vals)
	f := func(v float64) string { return decimal(v*scale, dec) }
	out := f(mid)
	if unit != "" {
		out += " " + unit
	}
	if len(vals) > 1 && f(lo) != f(hi) {
		out += " (" + f(lo) + "–" + f(hi) + ")"
	}
	return out
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
