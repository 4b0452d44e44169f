package report

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// recorded is the results directory of the repository: the raw output of
// the last full runs, with the summaries their scripts wrote.
const recorded = "../results"

// recordedRaw are the raw files of each comparison's last full run.
var recordedRaw = map[string][]string{
	"matcher":   {"matcher-amd64.txt", "matcher-386.txt"},
	"broker":    {"broker-amd64.txt"},
	"storage":   {"storage-amd64.txt"},
	"bridge":    {"bridge-amd64.txt"},
	"footprint": {"footprint-amd64.txt"},
	"idle":      {"idle-amd64.txt"},
}

// tableRows returns the table rows of a Markdown text, blank cells
// collapsed.
func tableRows(md string) []string {
	var rows []string
	for line := range strings.SplitSeq(collapse(md), "\n") {
		if strings.HasPrefix(line, "|") {
			rows = append(rows, line)
		}
	}
	return rows
}

// Every table row of a committed summary comes out of its raw output
// again, figure for figure.
func TestRecordedSummaries(t *testing.T) {
	for _, part := range Parts {
		t.Run(part, func(t *testing.T) {
			var paths []string
			for _, f := range recordedRaw[part] {
				paths = append(paths, filepath.Join(recorded, f))
			}
			var b bytes.Buffer
			if err := WriteSummary(&b, part, paths); err != nil {
				t.Fatal(err)
			}
			committed, err := os.ReadFile(filepath.Join(recorded, part+"-summary.md"))
			if err != nil {
				t.Fatal(err)
			}
			got := tableRows(b.String())
			want := tableRows(string(committed))
			if len(want) == 0 {
				t.Fatalf("%s-summary.md has no table", part)
			}
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("the tables differ from %s-summary.md:\n%s", part, b.String())
			}
		})
	}
}

// The report of the recorded runs: the verdict on every target, and rows
// of each comparison's tables.
func TestRecordedReport(t *testing.T) {
	md, svg := writeReport(t, recorded, false)
	for _, want := range []string{
		"| matcher | lookup (ns/op) ≥ 10× faster than mochi's TopicsIndex, every workload | amd64: lowest 11.3× (1M w10% shared d3 f1), none missed; 386: lowest 7.06× (1M w50% shared d5 f1), **3 of 29 workloads missed** | **✗ missed** |",
		"| matcher | lookup (ns/op) ≥ 2× faster than the NATS sublist, every workload | amd64: lowest 1.70× (1k w10% distinct d5 f1), **1 of 29 workloads missed**; 386: lowest 1.75× (1k w50% distinct d5 f1), **3 of 29 workloads missed** | **✗ missed** |",
		"| matcher | bytes/sub ≤ 1/15 of mochi's at 1M subscriptions | amd64: lowest 25.2× (1M w0% shared d5 f1), none missed; 386: lowest 20.8× (1M w0% shared d5 f1), none missed | ✓ met |",
		"| matcher | bytes/sub ≤ 1/6 of the NATS sublist's at 1M subscriptions | amd64: lowest 9.01× (1M w0% shared d5 f1), none missed; 386: lowest 6.82× (1M w0% shared d5 f1), none missed | ✓ met |",
		"| matcher | 0 allocations per lookup | amd64: 0 in all 29 workloads; 386: 0 in all 29 workloads | ✓ met |",
		"| broker | throughput ≥ 1.5× mochi, every throughput scenario | lowest 1.57× (qos0-10x10) | ✓ met |",
		"| broker | throughput ≥ 1× Mosquitto, every throughput scenario | lowest 2.96× (qos0-10x10) | ✓ met |",
		"| broker | RSS per idle connection ≤ 1/4 of mochi's | lowest 4.50× (idle-10000conns-5subs) | ✓ met |",
		"| broker | RSS per idle connection ≤ 16 KiB | idle-10000conns-5subs 13,096 B | ✓ met |",
		"| storage | PUBACKs/s ≥ 5× mochi + bolt at 100 publishers | lowest 155.3× (persist-qos1-100x3) | ✓ met |",
		"| storage | fsyncs per message ≤ 1/10 at 100 publishers | persist-qos1-100x3 0.00623 per message (one per 161 messages) | ✓ met |",
		"| bridge | drain ≥ 2× Mosquitto's bridge (messages per second from the first to the last message upstream) | 0.68× (fieldgate 35,194 msgs/s, Mosquitto 51,623) | **✗ missed** |",
		"| bridge | fieldgate delivers all 100,000 acknowledged messages after the outage, every run | 3 of 3 runs (delivered 100,000, 100,000, 100,000) | ✓ met |",
		"| bridge | fieldgate delivers all 100,000 acknowledged messages after SIGKILL right after the last PUBACK, every run | 3 of 3 runs (delivered 100,000, 100,000, 100,000) | ✓ met |",
		"| idle | CPU at rest ≤ 0.2 % of one core, embedded default, bridge connected, no traffic | 0.087 % (0.26 CPU s in 300 s) | ✓ met |",
		"| idle | CPU at rest ≤ 0.2 % of one core, 50 simulated sensors, bridge connected, no traffic | 0.137 % (0.41 CPU s in 300 s) | ✓ met |",
		"\n13 targets met, 3 missed.\n",
		// The matcher, the broker's sweeps, storage, the bridge, the footprint.
		"| 1M w10% distinct d5 f1 | 1.40 | 440 | 7750 | 3508 | 17.6× | 7.97× | 0 / 7 / 0 | 42.5 | 1645 | 710 | 38.7× | 16.7× | ok |",
		"| 100,000 | 40.2 | 246 | 106 | 6.10× | 2.64× |",
		"| `persist-qos1-100x3` | 90,073 | 580 | 84,115 | 155.3× | 1.07× |",
		"| drain, messages/s | 35,194 (28,398, 35,194, 35,874) | 51,623 (52,074, 51,623, 49,825) | 0.68× |",
		"| `fieldgate-linux-armv6` | linux/arm, GOARM=6 | 11,075,746 | 10.56 |",
		"| `default-forwarding` | embedded default, bridge carrying the readings | 6 | 0.250 % | 0.75 (0.29 + 0.46) | 57.1 | 225 | 383 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if entries, err := os.ReadDir(svg); err != nil || len(entries) != 6 {
		t.Errorf("plots %v, %v; want 6", entries, err)
	}
}
