package main

import (
	"bytes"
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

// runReport runs the command on a results directory and returns the
// report and the directory of the plots.
func runReport(t *testing.T, results string, extra ...string) (string, string) {
	t.Helper()
	root := t.TempDir()
	out := filepath.Join(root, "docs", "BENCHMARKS.md")
	svg := filepath.Join(root, "docs", "bench")
	var stdout, stderr bytes.Buffer
	args := append([]string{"-results", results, "-o", out, "-svg", svg, "-arch", "amd64"}, extra...)
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	md, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return string(md), svg
}

func TestReportQuick(t *testing.T) {
	results := t.TempDir()
	writeFiles(t, results, map[string]string{
		"bench-all-quick.txt": "mode: quick (QUICK=1)\nstart: 0\ncpu: Test CPU\ncores: 2\ngo: go1.26.8\n" +
			"mosquitto: 2.0.11\npart: matcher ok 40\npart: broker failed 75\nelapsed: 115\n",
		"broker-quick-summary.md":                  summaryMD,
		"broker-quick-amd64.txt":                   mainRaw,
		"sweep-conns1000-subs1000-quick-amd64.txt": sweepRaw,
		"matcher-quick-summary.md":                 matcherMD,
		"matcher-quick-amd64.txt":                  "BenchmarkMatch/impl=fieldgate/subs=1000/wild=10/prefix=distinct/depth=5/fanout=1-2 1 118 ns/op 51 bytes/sub\n",
		"footprint-summary.md":                     "## ARM footprint\n\n### Binaries\n\n| binary | size |\n|---|--:|\n| armv6 | 9 MB |\n",
		// A full run's files, which a quick report must not show.
		"broker-summary.md":                   "# Full broker title\n",
		"sweep-conns5000-subs10000-amd64.txt": strings.ReplaceAll(sweepRaw, "1000conns", "5000conns"),
	})
	md, svg := runReport(t, results, "-quick")

	for _, want := range []string{
		"QUICK RUN: THESE ARE NOT BENCHMARK RESULTS",
		"| CPU | Test CPU |",
		"| broker | failed | 1 min 15 s |",
		"| **total** | | **1 min 55 s** |",
		"| broker | throughput ≥ 1.5× mochi | lowest 3.43× (qos0-10x10) | ✓ met |",
		"| broker | drain ≥ 2× Mosquitto's bridge | 0.70× (fieldgate 33,300 msgs/s) | **✗ missed** |",
		"| matcher | 0 allocations per lookup |",
		"## MQTT broker: fieldgate vs mochi-mqtt\n",
		"### Memory\n",
		"## ARM footprint\n",
		"\n### Binaries\n",
		"from a full run: this quick run wrote no footprint-quick-summary.md",
		"[broker-quick-summary.md](../",
		"![Broker memory against subscriptions](bench/broker-subs-rss.svg)",
		"| 1,000 | 9.45 | 11.5 | – | 1.22× | – |", // RSS MiB at 1,000 subscriptions, mochi ÷ fieldgate
		"| 100,000 | 32.1 | – | 106 | – | 3.31× |",
		"No results: `bench-storage.sh` wrote no `storage-quick-summary.md`.",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, unwanted := range []string{"Full broker title", "5,000"} {
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
}

func TestReportFullWithoutResults(t *testing.T) {
	md, svg := runReport(t, t.TempDir())
	if strings.Contains(md, "QUICK RUN") {
		t.Error("a full report says it is a quick run")
	}
	for _, want := range []string{"## Machine and versions\n\nUnknown", "0 targets met, 0 missed.", "No results for: matcher, broker, storage, bridge, footprint."} {
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
	r := &report{out: filepath.Join(root, "docs", "BENCHMARKS.md")}
	if got, want := r.link("scripts/bench/results/broker-summary.md"), "[broker-summary.md](../scripts/bench/results/broker-summary.md)"; got != want {
		t.Errorf("link = %q, want %q", got, want)
	}
	if got, want := r.relative(filepath.Join(root, "docs", "bench", "a.svg")), "bench/a.svg"; got != want {
		t.Errorf("relative = %q, want %q", got, want)
	}
}
