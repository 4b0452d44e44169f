package main

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

func TestBenchSetMedians(t *testing.T) {
	s := newBenchSet()
	if err := s.read("sweep", strings.NewReader(sweepRaw)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, unit string
		want       float64
	}{
		{"BenchmarkBroker/fieldgate/idle-1000conns-5subs", "rss-MiB", 20.5},    // 20.5, 21.5, 19.5
		{"BenchmarkBroker/fieldgate/idle-1000conns-5subs", "conns/s", 9000},    // 7636, 10474, 9000
		{"BenchmarkBroker/mochi/subs-100conns-1000subs", "rss-B/sub", 2459},    // even count: mean of the middle two
		{"BenchmarkBroker/fieldgate/subs-100conns-1000subs", "subs/s", 700000}, // 814480, 635151, 700000
	} {
		got, ok := s.median(c.name, c.unit)
		if !ok || got != c.want {
			t.Errorf("median(%s, %s) = %v, %v; want %v", c.name, c.unit, got, ok, c.want)
		}
	}
	if _, ok := s.median("BenchmarkBroker/mochi/idle-1000conns-5subs", "heap-B/conn"); ok {
		t.Error("a median for a unit mochi never reported")
	}
	if n := len(s.vals["BenchmarkBroker/fieldgate/idle-1000conns-5subs"]["rss-MiB"]); n != 3 {
		t.Errorf("%d samples of fieldgate's idle RSS, want 3", n)
	}
	if len(s.names) != 4 {
		t.Errorf("names %q, want the 4 distinct benchmarks", s.names)
	}
}

func TestBenchSetBadNumber(t *testing.T) {
	s := newBenchSet()
	err := s.read("raw.txt", strings.NewReader("cpu: x\nBenchmarkBroker/a/b 1 12x rss-MiB\n"))
	if err == nil || !strings.Contains(err.Error(), "raw.txt:2") {
		t.Errorf("error %v, want one naming raw.txt:2", err)
	}
}

func TestCollectSweep(t *testing.T) {
	s := newBenchSet()
	for name, text := range map[string]string{"sweep": sweepRaw, "main": mainRaw} {
		if err := s.read(name, strings.NewReader(text)); err != nil {
			t.Fatal(err)
		}
	}
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

const summaryMD = "# MQTT broker: fieldgate vs mochi-mqtt\n" +
	"\n" +
	"- Machine: AMD EPYC\n" +
	"- Raw output: `results/broker-amd64.txt`.\n" +
	"\n" +
	"## Targets\n" +
	"\n" +
	"| target | result |\n" +
	"|---|---|\n" +
	"| throughput ≥ 1.5× mochi | ✓ lowest 3.43× (qos0-10x10) |\n" +
	"| drain ≥ 2× Mosquitto's bridge | **✗ 0.70× (fieldgate 33,300 msgs/s)** |\n" +
	"| something shown | n/a |\n" +
	"\n" +
	"## Memory\n" +
	"\n" +
	"```sh\n" +
	"## not a heading\n" +
	"```\n" +
	"\n" +
	"### Detail\n" +
	"\n" +
	"| scenario | fieldgate |\n" +
	"|---|--:|\n" +
	"| `idle` | 12,068 |\n"

func TestParseSummary(t *testing.T) {
	d := parseSummary(summaryMD)
	if d.title != "MQTT broker: fieldgate vs mochi-mqtt" {
		t.Errorf("title %q", d.title)
	}
	if len(d.intro) != 2 || !strings.HasPrefix(d.intro[0], "- Machine") {
		t.Errorf("intro %q, want the two bullets", d.intro)
	}
	if d.body[0] != "## Targets" {
		t.Errorf("body starts with %q, want the Targets heading", d.body[0])
	}

	shifted := strings.Join(shiftHeadings(d.body, 1), "\n")
	for _, want := range []string{"\n### Memory\n", "\n## not a heading\n", "\n#### Detail\n", "| `idle` | 12,068 |"} {
		if !strings.Contains("\n"+shifted+"\n", want) {
			t.Errorf("shifted body lacks %q:\n%s", want, shifted)
		}
	}

	got := targets(d)
	want := []target{
		{"throughput ≥ 1.5× mochi", "lowest 3.43× (qos0-10x10)", met},
		{"drain ≥ 2× Mosquitto's bridge", "0.70× (fieldgate 33,300 msgs/s)", missed},
		{"something shown", "n/a", unjudged},
	}
	if !slices.Equal(got, want) {
		t.Errorf("targets\n%+v\nwant\n%+v", got, want)
	}
}

// A summary written as a section of its own: a level-2 title, level-3
// sections.
func TestParseSummarySection(t *testing.T) {
	d := parseSummary("\n## ARM footprint\n\nIntro line.\n\n### Targets\n\n| target | result |\n|---|---|\n" +
		"| RSS ≤ 20 MiB on armv6 | **✗ 23 MiB** |\n\n### Binaries\n\n#### Detail\n")
	if d.title != "ARM footprint" || d.level != 3 {
		t.Errorf("title %q level %d, want ARM footprint at 3", d.title, d.level)
	}
	if !slices.Equal(d.intro, []string{"Intro line."}) {
		t.Errorf("intro %q", d.intro)
	}
	got := targets(d)
	if len(got) != 1 || got[0].result != "23 MiB" || got[0].verdict != missed {
		t.Errorf("targets %+v", got)
	}
	if ps := sections(d); len(ps) != 2 || ps[1].heading != "Binaries" {
		t.Errorf("sections %+v", ps)
	}
}

func TestReadMeta(t *testing.T) {
	m, err := readMeta(strings.NewReader("mode: full\ncpu: AMD EPYC 7B13\npart: matcher ok 1140\npart: broker failed 400\nnot meta\n"))
	if err != nil {
		t.Fatal(err)
	}
	if m.get("cpu") != "AMD EPYC 7B13" || m.get("missing") != "" {
		t.Errorf("meta %v", m)
	}
	if !slices.Equal(m["part"], []string{"matcher ok 1140", "broker failed 400"}) {
		t.Errorf("parts %q", m["part"])
	}
}

// matcherMD follows cmd/benchtable's layout: a targets bullet and one
// table per GOARCH, misses in bold with ✗.
const matcherMD = `# Subscription matcher: fieldgate vs mochi-mqtt vs NATS

- CPU: AMD EPYC
- Targets for fieldgate: ns/op ≥ 10× faster than mochi and ≥ 2× faster than nats; at 1000000 subscriptions bytes/sub ≤ 1/15 of mochi and ≤ 1/6 of nats; 0 allocs/op. Ratios are peer ÷ fieldgate.

## GOARCH=amd64

| workload | hits/op | mochi/fg speed | nats/fg speed | allocs/op fg / mochi / nats | mochi/fg mem | nats/fg mem | misses |
|---|--:|--:|--:|:-:|--:|--:|---|
| 1k w10% distinct d5 f1 | 1.53 | 12.3× | **1.73× ✗** | 0 / 7 / 0 | 5.5× | 3.9× | ✗ speed vs nats |
| 1M w10% distinct d5 f1 | 1.40 | **4.34× ✗** | 2.63× | 0 / 7 / 0 | 38.7× | 16.7× | ✗ speed vs mochi |
| 1M w0% shared d5 f1 | 1.35 | 17.9× | 8.79× | 0 / 6 / 0 | 25.2× | 9.01× | ok |

## GOARCH=386

| workload | hits/op | mochi/fg speed | nats/fg speed | allocs/op fg / mochi / nats | mochi/fg mem | nats/fg mem | misses |
|---|--:|--:|--:|:-:|--:|--:|---|
| 1M w0% shared d5 f1 | 1.35 | 17.7× | 6.38× | **2 / 6 / 0 ✗** | 20.8× | **5.82× ✗** | ✗ allocs, memory vs nats |

### Rows missing targets (3)
`

func TestMatcherHeadline(t *testing.T) {
	got := matcherHeadline(parseSummary(matcherMD))
	want := []struct {
		text    string
		result  string
		verdict verdict
	}{
		{"lookup (ns/op) ≥ 10× faster than mochi's TopicsIndex, every workload",
			"amd64: lowest 4.34× (1M w10% distinct d5 f1), **1 of 3 workloads missed**; 386: lowest 17.7× (1M w0% shared d5 f1), none missed", missed},
		{"lookup (ns/op) ≥ 2× faster than the NATS sublist, every workload",
			"amd64: lowest 1.73× (1k w10% distinct d5 f1), **1 of 3 workloads missed**; 386: lowest 6.38× (1M w0% shared d5 f1), none missed", missed},
		// Memory is judged at 1M only: the 1k row's 5.5× does not count.
		{"bytes/sub ≤ 1/15 of mochi's at 1M subscriptions",
			"amd64: lowest 25.2× (1M w0% shared d5 f1), none missed; 386: lowest 20.8× (1M w0% shared d5 f1), none missed", met},
		{"bytes/sub ≤ 1/6 of the NATS sublist's at 1M subscriptions",
			"amd64: lowest 9.01× (1M w0% shared d5 f1), none missed; 386: lowest 5.82× (1M w0% shared d5 f1), **1 of 1 workloads missed**", missed},
		{"0 allocations per lookup",
			"amd64: 0 in all 3 workloads; 386: up to 2 (1M w0% shared d5 f1), **1 of 1 workloads missed**", missed},
	}
	if len(got) != len(want) {
		t.Fatalf("%d targets, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		if got[i].text != w.text || got[i].result != w.result || got[i].verdict != w.verdict {
			t.Errorf("target %d:\n got %q / %q / %v\nwant %q / %q / %v", i, got[i].text, got[i].result, got[i].verdict, w.text, w.result, w.verdict)
		}
	}
}

func TestCellNumber(t *testing.T) {
	for in, want := range map[string]float64{"**4.34× ✗**": 4.34, "545.1×": 545.1, "0 / 1276 / 0": 0, "**2 / 6 / 0 ✗**": 2, "12,068": 12068} {
		if got, ok := cellNumber(in); !ok || got != want {
			t.Errorf("cellNumber(%q) = %v, %v; want %v", in, got, ok, want)
		}
	}
	if _, ok := cellNumber("–"); ok {
		t.Error("cellNumber(–) found a number")
	}
}

func TestMatcherFamily(t *testing.T) {
	s := newBenchSet()
	raw := "BenchmarkMatch/impl=fieldgate/subs=1000/wild=10/prefix=distinct/depth=5/fanout=1-2 \t 5086706 \t 118.5 ns/op \t 51.31 bytes/sub \t 0 allocs/op\n" +
		"BenchmarkMatch/impl=fieldgate/subs=1000/wild=10/prefix=distinct/depth=5/fanout=10000-2 \t 100 \t 831 ns/op\n" +
		"BenchmarkMatch/impl=nats/subs=1000000/wild=10/prefix=distinct/depth=5/fanout=1-2 \t 100 \t 3043 ns/op \t 710 bytes/sub\n" +
		"BenchmarkMatch/impl=nats/subs=1000000/wild=10/prefix=shared/depth=5/fanout=1-2 \t 100 \t 2486 ns/op\n"
	if err := s.read("m", strings.NewReader(raw)); err != nil {
		t.Fatal(err)
	}
	c := collect(s, matcherRE)
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
	for v, want := range map[float64]string{1234567: "1,234,567", 1000: "1,000", 237.4: "237", 42.26: "42.3", 9.456: "9.46", 3: "3"} {
		if got := fmtNum(v); got != want {
			t.Errorf("fmtNum(%v) = %q, want %q", v, got, want)
		}
	}
	if got := fmtRatio(4.62); got != "4.62×" {
		t.Errorf("fmtRatio(4.62) = %q", got)
	}
	if got := fmtRatio(148.93); got != "148.9×" {
		t.Errorf("fmtRatio(148.93) = %q", got)
	}
	if got := duration(1152); got != "19 min 12 s" {
		t.Errorf("duration(1152) = %q", got)
	}
	if !regexp.MustCompile(`^\d+ s$`).MatchString(duration(42)) {
		t.Errorf("duration(42) = %q", duration(42))
	}
}
