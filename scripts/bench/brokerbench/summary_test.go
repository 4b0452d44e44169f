package brokerbench

import (
	"io"
	"strings"
	"testing"
)

const rawHeader = `cpu: AMD EPYC
cores: 2
goos: linux
goarch: amd64
go: go1.26.8
mochi: github.com/mochi-mqtt/server/v2 v2.7.9
mosquitto: 2.0.11
`

const rawPeers = `BenchmarkBroker/mochi/qos0-10x10 1 200000 msgs/s 210000 sent/s 95 delivered-%
BenchmarkBroker/mochi/qos0-10x10 1 100000 msgs/s
BenchmarkBroker/mochi/qos0-10x10 1 160000 msgs/s
BenchmarkBroker/mosquitto/qos0-10x10 1 140000 msgs/s
BenchmarkBroker/mochi/latency-qos0-10x10-1000mps 1 100 p50-us 150 p90-us 300 p99-us 900 max-us 1000 msgs/s
BenchmarkBroker/mosquitto/latency-qos0-10x10-1000mps 1 60 p50-us 90 p90-us 200 p99-us 800 max-us 1000 msgs/s
BenchmarkBroker/mochi/idle-10000conns-5subs 1 60000 rss-B/conn 80000 heap-B/conn 9.5 rss-base-MiB 580 rss-MiB 4000 conns/s
BenchmarkBroker/mosquitto/idle-10000conns-5subs 1 4900 rss-B/conn 8.5 rss-base-MiB 55 rss-MiB 11000 conns/s
`

func TestSummary(t *testing.T) {
	for _, tc := range []struct {
		name    string
		raw     string
		want    []string
		wantNot []string
	}{
		{
			name: "fieldgate skipped",
			raw:  rawHeader + "# skip fieldgate: no CONNACK from 127.0.0.1:18831 within 5s: EOF\n" + rawPeers,
			want: []string{
				"- Machine: AMD EPYC, 2 cores, linux/amd64.",
				"| throughput ≥ 1.5× mochi, every throughput scenario | not measured: fieldgate skipped (no CONNACK from 127.0.0.1:18831 within 5s: EOF) |",
				"| RSS per idle connection ≤ 16 KiB | not measured: fieldgate skipped",
				"| `qos0-10x10` | – | 160,000 | 140,000 | – | – |", // the median of three mochi runs
				"| | heap B/conn | – | 80,000 | n/a | – | – |",
				"- fieldgate skipped in 1 run(s): no CONNACK",
			},
		},
		{
			name: "fieldgate meets the targets",
			raw: rawHeader + rawPeers + `BenchmarkBroker/fieldgate/qos0-10x10 1 480000 msgs/s
BenchmarkBroker/fieldgate/idle-10000conns-5subs 1 8000 rss-B/conn 5000 heap-B/conn 9 rss-base-MiB 85 rss-MiB 9000 conns/s
BenchmarkBroker/fieldgate/latency-qos0-10x10-1000mps 1 50 p50-us 80 p90-us 150 p99-us 400 max-us 1000 msgs/s
`,
			want: []string{
				"| throughput ≥ 1.5× mochi, every throughput scenario | ✓ lowest 3.00× (qos0-10x10) |",
				"| throughput ≥ 1× Mosquitto, every throughput scenario | ✓ lowest 3.43× (qos0-10x10) |",
				"| RSS per idle connection ≤ 1/4 of mochi's | ✓ lowest 7.50× (idle-10000conns-5subs) |",
				"| RSS per idle connection ≤ 16 KiB | ✓ idle-10000conns-5subs 8,000 B |",
				"| `qos0-10x10` | 480,000 | 160,000 | 140,000 | 3.00× | 3.43× |",
				"| `latency-qos0-10x10-1000mps` | p50 | 50.0 | 100 | 60.0 | 2.00× | 1.20× |",
			},
			wantNot: []string{"Skipped runs"},
		},
		{
			name: "fieldgate misses the targets",
			raw: rawHeader + rawPeers + `BenchmarkBroker/fieldgate/qos0-10x10 1 150000 msgs/s
BenchmarkBroker/fieldgate/idle-10000conns-5subs 1 20000 rss-B/conn 9 rss-base-MiB 200 rss-MiB 9000 conns/s
# warn fieldgate/qos0-10x10: EOF
`,
			want: []string{
				"| throughput ≥ 1.5× mochi, every throughput scenario | **✗ qos0-10x10 0.94×** |",
				"| throughput ≥ 1× Mosquitto, every throughput scenario | ✓ lowest 1.07× (qos0-10x10) |",
				"| RSS per idle connection ≤ 1/4 of mochi's | **✗ idle-10000conns-5subs 3.00×** |",
				"| RSS per idle connection ≤ 16 KiB | **✗ idle-10000conns-5subs 20,000 B** |",
				"- fieldgate/qos0-10x10: EOF",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkSummary(t, "results/broker-amd64.txt", tc.raw, (*Summary).WriteMarkdown, tc.want, tc.wantNot)
		})
	}
}

// checkSummary reads raw as the file name, renders it with write and
// reports every line of want the Markdown lacks and every string of
// wantNot it has. It returns the Markdown.
func checkSummary(t *testing.T, name, raw string, write func(*Summary, io.Writer) error, want, wantNot []string) string {
	t.Helper()
	s := NewSummary()
	if err := s.Read(name, strings.NewReader(raw)); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := write(s, &b); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	// Table rows are compared with their blank lead cells collapsed.
	flat := strings.ReplaceAll(md, "|  |", "| |")
	for _, w := range want {
		if !strings.Contains(flat, w) {
			t.Errorf("summary lacks %q:\n%s", w, md)
		}
	}
	for _, w := range wantNot {
		if strings.Contains(md, w) {
			t.Errorf("summary has %q:\n%s", w, md)
		}
	}
	return md
}

func TestSummaryRejectsMalformedLines(t *testing.T) {
	s := NewSummary()
	err := s.Read("raw.txt", strings.NewReader("BenchmarkBroker/mochi/qos0-10x10 1 fast msgs/s\n"))
	if err == nil || !strings.Contains(err.Error(), "raw.txt:1") {
		t.Errorf("Read = %v, want an error naming raw.txt:1", err)
	}
}

func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		v          float64
		value, num string
	}{
		{v: 0, value: "0", num: "0.0"},
		{v: 0.01234, value: "0.0123", num: "0.01"},
		{v: 3.14159, value: "3.14", num: "3.14"},
		{v: 42.42, value: "42.42", num: "42.4"},
		{v: 123.456, value: "123.5", num: "123"},
		{v: 1234567.8, value: "1234568", num: "1,234,568"},
		{v: -18928, value: "-18928", num: "-18,928"},
	} {
		if got := formatValue(tc.v); got != tc.value {
			t.Errorf("formatValue(%v) = %q, want %q", tc.v, got, tc.value)
		}
		if got := fmtNum(tc.v); got != tc.num {
			t.Errorf("fmtNum(%v) = %q, want %q", tc.v, got, tc.num)
		}
	}
}
