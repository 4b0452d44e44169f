package report

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// writeReport writes the report of a results directory and returns it,
// its blank table cells collapsed ("|  |" as "| |"), and the directory of
// the plots.
func writeReport(t *testing.T, results string, quick bool) (string, string) {
	t.Helper()
	root := t.TempDir()
	r := &Report{Results: results, Out: filepath.Join(root, "docs", "BENCHMARKS.md"),
		SVGDir: filepath.Join(root, "docs", "bench"), Arch: "amd64", Quick: quick}
	if _, err := r.Write(); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(r.Out)
	if err != nil {
		t.Fatal(err)
	}
	return collapse(string(md)), r.SVGDir
}

// collapse writes a table's blank cells as "| |", the way the tests
// spell them.
func collapse(md string) string { return strings.ReplaceAll(md, "|  |", "| |") }

// quickBroker is a quick broker run: the memory scenarios at their larger
// sizes and one throughput scenario, 3.43 times mochi's.
const quickBroker = mainRaw + "BenchmarkBroker/mochi/qos0-10x10 1 203868 msgs/s\n"

// quickBridge is a quick bridge run whose drain is 0.70 of Mosquitto's.
const quickBridge = "n: 100000\n" +
	"BenchmarkBroker/fieldgate/drain 1 100 delivered-% 100000 delivered 0 dups 33300 msgs/s\n" +
	"BenchmarkBroker/mosquitto/drain 1 100 delivered-% 100000 delivered 0 dups 47571 msgs/s\n"

func TestReportQuick(t *testing.T) {
	results := t.TempDir()
	writeFiles(t, results, map[string]string{
		"bench-all-quick.txt": "mode: quick (QUICK=1)\nstart: 0\ncpu: Test CPU\ncores: 2\ngo: go1.26.8\n" +
			"mosquitto: 2.0.11\npart: matcher ok 40\npart: broker failed 75\nelapsed: 115\n",
		"broker-quick-amd64.txt":                   quickBroker,
		"bridge-quick-amd64.txt":                   quickBridge,
		"sweep-conns1000-subs1000-quick-amd64.txt": sweepRaw,
		"matcher-quick-amd64.txt":                  "BenchmarkMatch/impl=fieldgate/subs=1000/wild=10/prefix=distinct/depth=5/fanout=1-2 1 118 ns/op 51 bytes/sub 0 allocs/op\n",
		"footprint-amd64.txt":                      sampleFootprint,
		// A full run's files, which a quick report must not show.
		"broker-amd64.txt":                    "fieldgate: the full run's build\n" + quickBroker,
		"sweep-conns5000-subs10000-amd64.txt": strings.ReplaceAll(sweepRaw, "1000conns", "5000conns"),
	})
	md, svg := writeReport(t, results, true)

	for _, want := range []string{
		"QUICK RUN: THESE ARE NOT BENCHMARK RESULTS",
		"| CPU | Test CPU |",
		"| broker | failed | 1 min 15 s |",
		"| **total** | | **1 min 55 s** |",
		"| broker | throughput ≥ 1.5× mochi, every throughput scenario | lowest 3.43× (qos0-10x10) | ✓ met |",
		"| bridge | drain ≥ 2× Mosquitto's bridge (messages per second from the first to the last message upstream) | 0.70× (fieldgate 33,300 msgs/s, Mosquitto 47,571) | **✗ missed** |",
		"| matcher | 0 allocations per lookup |",
		"## MQTT broker: fieldgate vs mochi-mqtt vs Mosquitto\n",
		"### Memory: broker process after minus before\n",
		"## ARM footprint\n",
		"\n### Binary sizes\n",
		"from a full run: this quick run wrote no footprint-quick-amd64.txt",
		"[broker-quick-amd64.txt](../",
		"![Broker memory against subscriptions](bench/broker-subs-rss.svg)",
		"| 1,000 | 9.45 | 11.5 | – | 1.22× | – |", // RSS MiB at 1,000 subscriptions, mochi ÷ fieldgate
		"| 100,000 | 32.1 | – | 106 | – | 3.31× |",
		"No results: `bench-storage.sh` wrote no `storage-quick-amd64.txt`.",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, unwanted := range []string{"the full run's build", "5,000"} {
		if strings.Contains(md, unwanted) {
			t.Errorf("quick report shows a full run's %q", unwanted)
		}
	}
	if !regexp.MustCompile(`(?m)^[0-9]+ targets met, [0-9]+ missed\.`).MatchString(md) {
		t.Error("report lacks the count of targets met and missed")
	}

	// Every image the report links to exists and is well-formed SVG.
	links := regexp.MustCompile(`!\[[^]]*\]\(bench/([a-z-]+\.svg)\)`).FindAllStringSubmatch(md, -1)
	if len(links) != 6 {
		t.Errorf("%d plots linked, want 6", len(links))
	}
	for _, l := range links {
		data, err := os.ReadFile(filepath.Join(svg, l[1]))
		if err != nil {
			t.Error(err)
			continue
		}
		all := parseSVG(t, data)
		if len(elements(all, "polyline")) == 0 {
			t.Errorf("%s has no line", l[1])
		}
	}
	if t.Failed() {
		t.Log(md)
	}
}

func TestReportFullWithoutResults(t *testing.T) {
	md, svg := writeReport(t, t.TempDir(), false)
	if strings.Contains(md, "QUICK RUN") {
		t.Error("a full report says it is a quick run")
	}
	for _, want := range []string{"## Machine and versions\n\nUnknown", "0 targets met, 0 missed.", "No results for: matcher, broker, storage, bridge, footprint, idle."} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if entries, _ := os.ReadDir(svg); len(entries) != 0 {
		t.Errorf("plots written without data: %v", entries)
	}
}

// bench-all.sh passes a relative results directory and an absolute report
// path: links must still lead from the report to the files.
func TestRelativeLinks(t *testing.T) {
	root := t.TempDir()
	t.Chdir(root)
	r := &Report{Out: filepath.Join(root, "docs", "BENCHMARKS.md")}
	if got, want := r.link("scripts/bench/results/broker-summary.md"), "[broker-summary.md](../scripts/bench/results/broker-summary.md)"; got != want {
		t.Errorf("link = %q, want %q", got, want)
	}
	if got, want := r.relative(filepath.Join(root, "docs", "bench", "a.svg")), "bench/a.svg"; got != want {
		t.Errorf("relative = %q, want %q", got, want)
	}
}

// A part the record does not list ran in an earlier run, and says so; so
// does one whose raw output is dated before the run began.
func TestReportStaleParts(t *testing.T) {
	results := t.TempDir()
	writeFiles(t, results, map[string]string{
		"bench-all.txt":       "mode: full\nstart: 1796014559\npart: broker ok 404\npart: storage ok 400\nelapsed: 804\n",
		"broker-amd64.txt":    "date: 2026-11-30T04:56Z\n" + quickBroker,
		"storage-amd64.txt":   "date: 2026-11-30T00:54Z\n" + rawStorage,
		"footprint-amd64.txt": sampleFootprint,
	})
	md, _ := writeReport(t, results, false)
	for _, want := range []string{
		"written by `scripts/bench/bench-broker.sh`.\n",
		"**Note: dated 2026-11-30T00:54Z, before this run started, so it is from an earlier run.**",
		"**Note: from an earlier run: this one did not run the footprint part (the raw output is dated 2026-11-30T00:00Z).**",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(md)
	}
}

// The notes of the record follow the machine's table.
func TestReportNotes(t *testing.T) {
	results := t.TempDir()
	writeFiles(t, results, map[string]string{"bench-all.txt": "mode: full\ncpu: x\nnote: Assembled from two runs.\nnote: The second on new code.\n"})
	md, _ := writeReport(t, results, false)
	if want := "| bbolt | unknown |\n\nAssembled from two runs.\n\nThe second on new code.\n\nRun: **full**"; !strings.Contains(md, want) {
		t.Errorf("report lacks %q:\n%s", want, md)
	}
}

// The report cites the one file of targets, by a path that leads there
// from docs/.
func TestReportCitesTargets(t *testing.T) {
	root := t.TempDir()
	results := filepath.Join(root, "scripts", "bench", "results")
	if err := os.MkdirAll(results, 0o755); err != nil {
		t.Fatal(err)
	}
	r := &Report{Results: results, Out: filepath.Join(root, "docs", "BENCHMARKS.md"), SVGDir: filepath.Join(root, "docs", "bench"), Arch: "amd64"}
	if _, err := r.Write(); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(r.Out)
	if err != nil {
		t.Fatal(err)
	}
	if want := "[scripts/bench/targets/targets.go](../scripts/bench/targets/targets.go)"; !strings.Contains(string(md), want) {
		t.Errorf("report lacks %q", want)
	}
}
