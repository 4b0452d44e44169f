package report

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// sweepRaw is raw output of bench-broker.sh's memory scenarios as a sweep
// writes it: a header, three repetitions, and the comments the load
// generator adds.
const sweepRaw = `cpu: AMD EPYC
cores: 2
goarch: amd64
settings: COUNT=3 CONNS=1000 SUBS=1000 over 100 connections
# skip nobody: just a comment
BenchmarkBroker/fieldgate/idle-1000conns-5subs 1 12000 rss-B/conn 2800 heap-B/conn 9.35 rss-base-MiB 20.5 rss-MiB 7636 conns/s
BenchmarkBroker/fieldgate/subs-100conns-1000subs 1 240 rss-B/sub 9.40 rss-MiB 814480 subs/s
BenchmarkBroker/mochi/idle-1000conns-5subs 1 57505 rss-B/conn 9.23 rss-base-MiB 64 rss-MiB 4915 conns/s
# warn mochi/subs-100conns-1000subs: a note about the run
BenchmarkBroker/mochi/subs-100conns-1000subs 1 2494 rss-B/sub 11.6 rss-MiB 167648 subs/s
BenchmarkBroker/fieldgate/idle-1000conns-5subs 1 12100 rss-B/conn 2900 heap-B/conn 9.40 rss-base-MiB 21.5 rss-MiB 10474 conns/s
BenchmarkBroker/fieldgate/subs-100conns-1000subs 1 239 rss-B/sub 9.50 rss-MiB 635151 subs/s
BenchmarkBroker/mochi/idle-1000conns-5subs 1 52815 rss-B/conn 9.19 rss-base-MiB 60 rss-MiB 3822 conns/s
BenchmarkBroker/mochi/subs-100conns-1000subs 1 2424 rss-B/sub 11.4 rss-MiB 185934 subs/s
BenchmarkBroker/fieldgate/idle-1000conns-5subs 1 11900 rss-B/conn 2700 heap-B/conn 9.30 rss-base-MiB 19.5 rss-MiB 9000 conns/s
BenchmarkBroker/fieldgate/subs-100conns-1000subs 1 241 rss-B/sub 9.45 rss-MiB 700000 subs/s
loadavg-end: 1.00 1.00 1.00
`

// mainRaw is the broker run's own memory scenarios at its larger sizes.
const mainRaw = `BenchmarkBroker/fieldgate/qos0-10x10 1 699268 msgs/s 1314246 sent/s 53.21 delivered-%
BenchmarkBroker/fieldgate/idle-10000conns-5subs 1 11989 rss-B/conn 123.7 rss-MiB 7636 conns/s
BenchmarkBroker/fieldgate/subs-100conns-100000subs 1 237.4 rss-B/sub 32.07 rss-MiB 814480 subs/s
BenchmarkBroker/mosquitto/subs-100conns-100000subs 1 1024 rss-B/sub 106.1 rss-MiB 391657 subs/s
`

// readSamples reads raw output into samples.
func readSamples(t *testing.T, raws ...string) *samples {
	t.Helper()
	s := newSamples()
	for i, raw := range raws {
		f, err := parseRaw("raw"+string(rune('0'+i)), []byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range f.results {
			s.add(r)
		}
	}
	return s
}

func TestSamplesMedians(t *testing.T) {
	s := readSamples(t, sweepRaw)
	for _, c := range []struct {
		name, unit string
		want       float64
	}{
		{"Broker/fieldgate/idle-1000conns-5subs", "rss-MiB", 20.5},    // 20.5, 21.5, 19.5
		{"Broker/fieldgate/idle-1000conns-5subs", "conns/s", 9000},    // 7636, 10474, 9000
		{"Broker/mochi/subs-100conns-1000subs", "rss-B/sub", 2459},    // even count: mean of the middle two
		{"Broker/fieldgate/subs-100conns-1000subs", "subs/s", 700000}, // 814480, 635151, 700000
	} {
		got, ok := s.median(c.name, c.unit)
		if !ok || got != c.want {
			t.Errorf("median(%s, %s) = %v, %v; want %v", c.name, c.unit, got, ok, c.want)
		}
	}
	if _, ok := s.median("Broker/mochi/idle-1000conns-5subs", "heap-B/conn"); ok {
		t.Error("a median for a unit mochi never reported")
	}
	if n := len(s.vals["Broker/fieldgate/idle-1000conns-5subs"]["rss-MiB"]); n != 3 {
		t.Errorf("%d samples of fieldgate's idle RSS, want 3", n)
	}
	if len(s.names) != 4 {
		t.Errorf("names %q, want the 4 distinct benchmarks", s.names)
	}
}

func TestRawBadNumber(t *testing.T) {
	_, err := parseRaw("raw.txt", []byte("cpu: x\nBenchmarkBroker/a/b 1 12x rss-MiB\n"))
	if err == nil || !strings.Contains(err.Error(), "raw.txt:2") {
		t.Errorf("error %v, want one naming raw.txt:2", err)
	}
}

// Units keep the scale they were written in: benchfmt's tidy sec/op is
// not what the tables show.
func TestRawUnits(t *testing.T) {
	f, err := parseRaw("raw", []byte("goarch: 386\nBenchmarkMatch/impl=nats/subs=1000/wild=0-2 \t 100 \t 298.4 ns/op \t 625.5 bytes/sub \t 0 allocs/op\n"))
	if err != nil {
		t.Fatal(err)
	}
	r := f.results[0]
	if r.name != "Match/impl=nats/subs=1000/wild=0" || r.config["goarch"] != "386" {
		t.Errorf("name %q config %v: want no GOMAXPROCS suffix, goarch 386", r.name, r.config)
	}
	if want := []value{{298.4, "ns/op"}, {625.5, "bytes/sub"}, {0, "allocs/op"}}; !slices.Equal(r.values, want) {
		t.Errorf("values %v, want %v", r.values, want)
	}
}

func TestCollectSweep(t *testing.T) {
	s := readSamples(t, sweepRaw, mainRaw)
	subs := collect(s, subsRE)
	if !slices.Equal(subs.impls, []string{"fieldgate", "mochi", "mosquitto"}) {
		t.Errorf("impls %q, want fieldgate, mochi, mosquitto in that order", subs.impls)
	}
	if !slices.Equal(subs.counts, []float64{1000, 100000}) {
		t.Errorf("counts %v, want [1000 100000]", subs.counts)
	}
	got := subs.points("fieldgate", "rss-MiB")
	want := []Point{{1000, 9.45}, {100000, 32.07}}
	if !slices.Equal(got, want) {
		t.Errorf("fieldgate RSS points %v, want %v", got, want)
	}
	if pts := subs.points("mosquitto", "rss-MiB"); len(pts) != 1 {
		t.Errorf("mosquitto points %v, want only the 100k one", pts)
	}
	conns := collect(s, idleRE)
	if !slices.Equal(conns.counts, []float64{1000, 10000}) {
		t.Errorf("connection counts %v, want [1000 10000]", conns.counts)
	}
	if v, ok := conns.value("mochi", 1000, "rss-MiB"); !ok || v != 62 {
		t.Errorf("mochi RSS at 1000 connections %v, %v; want 62", v, ok)
	}
}

func TestRawLines(t *testing.T) {
	f, err := parseRaw("raw", []byte("mode: full\ncpu: AMD EPYC 7B13\npart: matcher ok 1140\npart: broker failed 400\nnot meta\n"+
		"# skip mosquitto: not installed\n# warn mochi/qos0: EOF\n--- FAIL: BenchmarkMatch\nsize armv6 bytes=12 file=f\nrunner armv6 qemu-arm-static -cpu arm1176\n"))
	if err != nil {
		t.Fatal(err)
	}
	m := f.meta
	if m.get("cpu") != "AMD EPYC 7B13" || m.get("missing") != "" {
		t.Errorf("meta %v", m)
	}
	if !slices.Equal(m["part"], []string{"matcher ok 1140", "broker failed 400"}) {
		t.Errorf("parts %q", m["part"])
	}
	if !slices.Equal(f.skips, []skip{{"mosquitto", "not installed"}}) || !slices.Equal(f.warnings, []string{"mochi/qos0: EOF"}) {
		t.Errorf("skips %v warnings %q", f.skips, f.warnings)
	}
	if !slices.Equal(f.problems, []string{"skip mosquitto: not installed", "warn mochi/qos0: EOF"}) {
		t.Errorf("problems %q", f.problems)
	}
	if !slices.Equal(f.failures, []string{"--- FAIL: BenchmarkMatch"}) {
		t.Errorf("failures %q", f.failures)
	}
	if len(f.records) != 2 || f.records[0].kv["bytes"] != "12" || f.records[1].kv["how"] != "qemu-arm-static -cpu arm1176" {
		t.Errorf("records %+v", f.records)
	}
}

func TestMatcherFamily(t *testing.T) {
	raw := "BenchmarkMatch/impl=fieldgate/subs=1000/wild=10/prefix=distinct/depth=5/fanout=1-2 \t 5086706 \t 118.5 ns/op \t 51.31 bytes/sub \t 0 allocs/op\n" +
		"BenchmarkMatch/impl=fieldgate/subs=1000/wild=10/prefix=distinct/depth=5/fanout=10000-2 \t 100 \t 831 ns/op\n" +
		"BenchmarkMatch/impl=nats/subs=1000000/wild=10/prefix=distinct/depth=5/fanout=1-2 \t 100 \t 3043 ns/op \t 710 bytes/sub\n" +
		"BenchmarkMatch/impl=nats/subs=1000000/wild=10/prefix=shared/depth=5/fanout=1-2 \t 100 \t 2486 ns/op\n"
	c := collect(readSamples(t, raw), matcherFamilyRE)
	if !slices.Equal(c.impls, []string{"fieldgate", "nats"}) || !slices.Equal(c.counts, []float64{1000, 1e6}) {
		t.Errorf("impls %q counts %v", c.impls, c.counts)
	}
	if got := c.points("fieldgate", "ns/op"); !slices.Equal(got, []Point{{1000, 118.5}}) {
		t.Errorf("fieldgate ns/op %v: the fan-out row must not count", got)
	}
	if got := c.points("nats", "bytes/sub"); !slices.Equal(got, []Point{{1e6, 710}}) {
		t.Errorf("nats bytes/sub %v", got)
	}
}

func TestFormatting(t *testing.T) {
	for v, want := range map[float64]string{1234567: "1,234,567", 1000: "1,000", 237.4: "237", 42.26: "42.3", 9.456: "9.46", 3: "3", -18928: "-18,928"} {
		if got := number(v); got != want {
			t.Errorf("number(%v) = %q, want %q", v, got, want)
		}
	}
	if got := ratio(4.62); got != "4.62×" {
		t.Errorf("ratio(4.62) = %q", got)
	}
	if got := ratio(148.93); got != "148.9×" {
		t.Errorf("ratio(148.93) = %q", got)
	}
	if got := duration(1152); got != "19 min 12 s" {
		t.Errorf("duration(1152) = %q", got)
	}
	if !regexp.MustCompile(`^\d+ s$`).MatchString(duration(42)) {
		t.Errorf("duration(42) = %q", duration(42))
	}
}

// A comparison's table shows a verdict with its mark; the report's
// headline shows the result without it and the verdict in a column.
func TestVerdicts(t *testing.T) {
	for _, c := range []struct {
		v          verdict
		cell, word string
	}{
		{judged("throughput ≥ 1.5× mochi", true, "lowest 3.43× (qos0-10x10)"), "✓ lowest 3.43× (qos0-10x10)", "✓ met"},
		{judged("drain ≥ 2× Mosquitto's bridge", false, "0.70× (fieldgate 33,300 msgs/s)"), "**✗ 0.70× (fieldgate 33,300 msgs/s)**", "**✗ missed**"},
		{notJudged("something shown", "n/a"), "n/a", "not judged"},
	} {
		if got := c.v.cell(); got != c.cell {
			t.Errorf("cell of %v = %q, want %q", c.v, got, c.cell)
		}
		if got := c.v.outcome.String(); got != c.word {
			t.Errorf("outcome of %v = %q, want %q", c.v, got, c.word)
		}
	}
}
