package matcherbench

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// ---- verification ----

// matchSets holds one implementation's answer for every topic of a workload.
type matchSets struct {
	off  []int32 // topic i's handles are flat[off[i]:off[i+1]]
	flat []uint32
}

func (m *matchSets) get(i int) []uint32 { return m.flat[m.off[i]:m.off[i+1]] }

func collect(x Impl, w *Workload) *matchSets {
	m := &matchSets{off: make([]int32, 1, len(w.Topics)+1)}
	var buf []uint32
	for _, t := range w.Topics {
		buf = x.Match(x.Native(t), buf)
		m.flat = append(m.flat, buf...)
		m.off = append(m.off, int32(len(m.flat)))
	}
	return m
}

// compareSets checks that every implementation returned the same handles for
// every topic. It returns a description of the first few disagreements and
// the number of topics on which they disagree.
func compareSets(w *Workload, names []string, sets []*matchSets) (string, int) {
	var sb strings.Builder
	bad := 0
	for i, topic := range w.Topics {
		same := true
		for k := 1; k < len(sets); k++ {
			if !slices.Equal(sets[0].get(i), sets[k].get(i)) {
				same = false
				break
			}
		}
		if same {
			continue
		}
		bad++
		if bad > 5 {
			continue
		}
		fmt.Fprintf(&sb, "\ntopic %q:", topic)
		for k, name := range names {
			fmt.Fprintf(&sb, "\n  %-9s %d sessions", name, len(sets[k].get(i)))
		}
		// Explain every handle some implementations report and others
		// do not, using the reference matcher on that session's filters.
		diff := map[uint32]bool{}
		for k := range sets {
			for _, h := range sets[k].get(i) {
				for j := range sets {
					if _, found := slices.BinarySearch(sets[j].get(i), h); !found {
						diff[h] = true
					}
				}
			}
		}
		hs := make([]uint32, 0, len(diff))
		for h := range diff {
			hs = append(hs, h)
		}
		slices.Sort(hs)
		for n, h := range hs {
			if n == 8 {
				fmt.Fprintf(&sb, "\n  ... %d more differing sessions", len(hs)-n)
				break
			}
			var who []string
			for k, name := range names {
				if _, found := slices.BinarySearch(sets[k].get(i), h); found {
					who = append(who, name)
				}
			}
			var filters []string
			ref := false
			for _, s := range w.Subs {
				if s.Handle == h {
					m := MatchFilter(s.Filter, topic)
					ref = ref || m
					filters = append(filters, fmt.Sprintf("%q(matches=%v)", s.Filter, m))
				}
			}
			fmt.Fprintf(&sb, "\n  session %d reported by %v; reference says match=%v; its filters: %s",
				h, who, ref, strings.Join(filters, ", "))
		}
	}
	if bad > 0 {
		fmt.Fprintf(&sb, "\n%d of %d topics disagree", bad, len(w.Topics))
	}
	return sb.String(), bad
}

// heapAlloc returns the bytes of live heap objects, after two collections.
func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	return heapNow()
}

// heapNow returns the bytes of heap objects, live or not yet collected.
func heapNow() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// buildOrder is the order verify builds ImplNames in (fieldgate, mochi,
// nats), and timeOrder the order BenchmarkMatch times them in (nats,
// fieldgate, mochi). verify keeps only the last index it built, and each
// timed implementation has the heap to itself (besides the workload): the
// testing package forces a full collection before every timed run (once per
// -count with b.Loop), and that takes seconds with a 1M-subscription mochi
// index alive. Each row builds nats once and fieldgate and mochi twice.
var (
	buildOrder = []int{0, 1, 2}
	timeOrder  = []int{2, 0, 1}
)

func keepAfterVerify(name string) bool { return name == ImplNames[buildOrder[len(buildOrder)-1]] }

// buildNoGC builds an index with the collector paused (up to a memory
// limit): the index is all live data, so collecting while it grows only costs
// time. The heap is measured afterwards with forced collections.
func buildNoGC(name string, w *Workload) Impl {
	limit := int64(12 << 30)
	if lowMemory {
		limit = 2816 << 20
	}
	oldLimit := debug.SetMemoryLimit(limit)
	oldPct := debug.SetGCPercent(-1)
	defer func() {
		debug.SetGCPercent(oldPct)
		debug.SetMemoryLimit(oldLimit)
	}()
	return Build(name, w)
}

// built is an index and what was measured while building it.
type built struct {
	x        Impl
	bytesSub float64
}

// verify builds every implementation for w in buildOrder (measuring the heap
// each one adds when measure is set), checks that they agree on every topic,
// and returns the indexes and the average size of the subscriber sets. An
// index is dropped (x = nil) once its answers are collected unless keep says
// otherwise.
func verify(tb testing.TB, w *Workload, measure bool, keep func(name string) bool) (map[string]*built, float64) {
	tb.Helper()
	out := map[string]*built{}
	sets := make([]*matchSets, len(ImplNames))
	for _, k := range buildOrder {
		name := ImplNames[k]
		var before uint64
		if measure {
			before = heapAlloc()
		}
		x := buildNoGC(name, w)
		bi := &built{x: x}
		if measure {
			after := heapAlloc()
			bi.bytesSub = (float64(after) - float64(before)) / float64(w.TotalSubs())
		}
		sets[k] = collect(x, w)
		if !keep(name) {
			bi.x = nil
		}
		out[name] = bi
		runtime.KeepAlive(x)
	}
	if msg, bad := compareSets(w, ImplNames, sets); bad > 0 {
		tb.Fatalf("%s: implementations disagree:%s", w.Name(), msg)
	}
	// The comparison is only meaningful if most topics match something.
	matched, total := 0, 0
	for i := range w.Topics {
		n := len(sets[0].get(i))
		total += n
		if n > 0 {
			matched++
		}
	}
	if matched < len(w.Topics)/2 {
		tb.Fatalf("%s: only %d of %d topics match any subscription", w.Name(), matched, len(w.Topics))
	}
	if w.HotSessions() > 0 {
		for i, t := range w.Topics {
			if t == w.HotTopic && len(sets[0].get(i)) < w.HotSessions() {
				tb.Fatalf("%s: hot topic %q matched %d sessions, want >= %d", w.Name(), t, len(sets[0].get(i)), w.HotSessions())
			}
		}
	}
	return out, float64(total) / float64(len(w.Topics))
}

// ---- tests ----

func equivalenceParams() []Params {
	var ps []Params
	for _, prefix := range []string{PrefixDistinct, PrefixShared} {
		for _, wild := range []int{0, 10, 50} {
			for _, depth := range []int{3, 5, 12} {
				ps = append(ps, Params{Subs: 2000, Wild: wild, Prefix: prefix, Depth: depth, Fanout: 1})
			}
		}
		ps = append(ps, Params{Subs: 1000, Wild: 10, Prefix: prefix, Depth: 5, Fanout: 10000})
	}
	return ps
}

func TestEquivalence(t *testing.T) {
	for _, p := range equivalenceParams() {
		t.Run(p.Name(), func(t *testing.T) {
			w := Generate(p)
			_, hits := verify(t, w, false, func(string) bool { return false })
			t.Logf("%d subscriptions, %d topics, %.1f sessions per topic", w.TotalSubs(), len(w.Topics), hits)
		})
	}
}

// faulty drops the highest handle of every non-empty answer, to show that the
// comparison notices a wrong implementation.
type faulty struct{ Impl }

func (f faulty) Match(topic string, dst []uint32) []uint32 {
	dst = f.Impl.Match(topic, dst)
	if len(dst) > 0 {
		dst = dst[:len(dst)-1]
	}
	return dst
}

func TestComparisonDetectsMismatch(t *testing.T) {
	w := Generate(Params{Subs: 500, Wild: 10, Prefix: PrefixDistinct, Depth: 5})
	a := collect(Build(ImplMochi, w), w)
	b := collect(faulty{Build(ImplNATS, w)}, w)
	msg, bad := compareSets(w, []string{ImplMochi, "faulty"}, []*matchSets{a, b})
	if bad == 0 {
		t.Fatal("a faulty implementation went unnoticed")
	}
	if !strings.Contains(msg, "reported by [mochi]") || !strings.Contains(msg, "match=true") {
		t.Fatalf("unexpected report:%s", msg)
	}
}

func TestWorkloadDeterministic(t *testing.T) {
	p := Params{Subs: 3000, Wild: 50, Prefix: PrefixShared, Depth: 12, Fanout: 100}
	a, b := Generate(p), Generate(p)
	if !slices.Equal(a.Topics, b.Topics) || !slices.Equal(a.Subs, b.Subs) {
		t.Fatal("workload generation is not deterministic")
	}
	if len(a.Subs) != 3100 || len(a.Topics) != TopicCount {
		t.Fatalf("got %d subs, %d topics", len(a.Subs), len(a.Topics))
	}
	wild := 0
	for _, s := range a.Subs {
		if strings.HasPrefix(s.Filter, "$") || strings.Contains(s.Filter, "//") {
			t.Fatalf("filter %q is not expressible in NATS", s.Filter)
		}
		if strings.ContainsAny(s.Filter, "+#") {
			wild++
		}
		if s.Handle == 0 || s.Handle > a.MaxHandle() {
			t.Fatalf("handle %d out of range", s.Handle)
		}
	}
	if wild < 1300 || wild > 1700 {
		t.Fatalf("%d wildcard filters of 3000 at 50%%", wild)
	}
}

func TestNATSSubjects(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"a/b/c", []string{"a.b.c"}},
		{"a/+/c", []string{"a.*.c"}},
		{"a/+/#", []string{"a.*.>", "a.*"}},
		{"devices/+/cmd/#", []string{"devices.*.cmd.>", "devices.*.cmd"}},
	} {
		if got := NATSSubjects(c.in); !slices.Equal(got, c.want) {
			t.Errorf("NATSSubjects(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// ---- benchmarks ----

// benchMaxSubs caps the workload size: BENCH_MAX_SUBS if set, else 100000
// with -short, else 1000000.
func benchMaxSubs(tb testing.TB) int {
	if s := os.Getenv("BENCH_MAX_SUBS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			tb.Fatalf("BENCH_MAX_SUBS=%q: %v", s, err)
		}
		return n
	}
	if testing.Short() {
		return 100000
	}
	return 1000000
}

// benchParams is the benchmark matrix.
func benchParams() []Params {
	var ps []Params
	for _, n := range []int{1000, 100000, 1000000} {
		for _, prefix := range []string{PrefixDistinct, PrefixShared} {
			for _, wild := range []int{0, 10, 50} {
				ps = append(ps, Params{Subs: n, Wild: wild, Prefix: prefix, Depth: 5, Fanout: 1})
			}
			if n >= 100000 {
				for _, depth := range []int{3, 12} {
					ps = append(ps, Params{Subs: n, Wild: 10, Prefix: prefix, Depth: depth, Fanout: 1})
				}
			}
		}
		ps = append(ps, Params{Subs: n, Wild: 10, Prefix: PrefixDistinct, Depth: 5, Fanout: 10000})
	}
	return ps
}

// rowState caches one workload row's indexes across the repeated calls the
// testing package makes for b.N and -count.
type rowState struct {
	name    string
	w       *Workload
	idx     map[string]*built
	hits    float64
	natives map[string][]string
}

var (
	row  *rowState
	sink int
)

// progress reports setup steps on stderr when BENCH_VERBOSE is set (not 0).
func progress(format string, args ...any) {
	if v := os.Getenv("BENCH_VERBOSE"); v != "" && v != "0" {
		fmt.Fprintf(os.Stderr, "# "+format+"\n", args...)
	}
}

// lowMemory: a 32-bit target, with at most 4 GiB of address space.
const lowMemory = unsafe.Sizeof(uintptr(0)) == 4

// getRow returns the state of p's row with impl's index built, and every
// other index of the row dropped.
func getRow(b *testing.B, p Params, impl string) *rowState {
	name := p.Name()
	if row == nil || row.name != name {
		row = nil // free the previous row's indexes before building more
		debug.FreeOSMemory()
		start := time.Now()
		w := Generate(p)
		gen := time.Since(start)
		idx, hits := verify(b, w, true, keepAfterVerify)
		row = &rowState{name: name, w: w, idx: idx, hits: hits, natives: map[string][]string{}}
		progress("%s: generated in %v, built and verified in %v", name, gen.Round(time.Millisecond), (time.Since(start) - gen).Round(time.Millisecond))
	}
	for n, o := range row.idx {
		if n != impl && o.x != nil {
			o.x = nil
			// Collect and hand the pages back to the OS now, so that the
			// runtime's background scavenger does not work through a freed
			// million-subscription index while the next one is timed.
			debug.FreeOSMemory()
		}
	}
	bi := row.idx[impl]
	if bi.x == nil {
		start := time.Now()
		bi.x = buildNoGC(impl, row.w)
		// Collect now: the collector was paused during the build, and would
		// otherwise start a cycle over the new index inside the timed loop.
		runtime.GC()
		progress("%s: rebuilt %s in %v", name, impl, time.Since(start).Round(time.Millisecond))
	}
	if row.natives[impl] == nil {
		nt := make([]string, len(row.w.Topics))
		for i, t := range row.w.Topics {
			nt[i] = bi.x.Native(t)
		}
		row.natives[impl] = nt
	}
	return row
}

// BenchmarkMatch times one subscriber lookup per op, cycling through the
// workload's publish topics, for each implementation on each workload.
// Custom metrics: bytes/sub (heap added by building the index, per
// subscription) and hits/op (average sessions matched per topic).
func BenchmarkMatch(b *testing.B) {
	maxSubs := benchMaxSubs(b)
	for _, p := range benchParams() {
		if p.Subs > maxSubs {
			continue
		}
		for _, k := range timeOrder {
			impl := ImplNames[k]
			b.Run("impl="+impl+"/"+p.Name(), func(b *testing.B) {
				rs := getRow(b, p, impl)
				x := rs.idx[impl].x
				topics := rs.natives[impl]
				mask := len(topics) - 1
				b.ReportAllocs()
				n, i := 0, 0
				for b.Loop() {
					n += x.MatchCount(topics[i&mask])
					i++
				}
				sink = n
				b.ReportMetric(rs.idx[impl].bytesSub, "bytes/sub")
				b.ReportMetric(rs.hits, "hits/op")
			})
		}
	}
	row = nil
}
