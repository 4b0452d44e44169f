package report

import (
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
			checkSummary(t, "broker", "results/broker-amd64.txt", tc.raw, tc.want, tc.wantNot)
		})
	}
}

// checkSummary reads raw as the file name, renders it as the summary of
// part and reports every line of want the Markdown lacks and every string
// of wantNot it has. It returns the Markdown.
func checkSummary(t *testing.T, part, name, raw string, want, wantNot []string) string {
	t.Helper()
	f, err := parseRaw(name, []byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	c, err := comparisonNamed(part)
	if err != nil {
		t.Fatal(err)
	}
	md := render(c.read([]*rawFile{f}, nil))
	// Table rows are compared with their blank lead cells collapsed.
	flat := collapse(md)
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
	_, err := parseRaw("raw.txt", []byte("BenchmarkBroker/mochi/qos0-10x10 1 fast msgs/s\n"))
	if err == nil || !strings.Contains(err.Error(), "raw.txt:1") {
		t.Errorf("parseRaw = %v, want an error naming raw.txt:1", err)
	}
}

func TestFigure(t *testing.T) {
	for _, tc := range []struct {
		v   float64
		num string
	}{
		{v: 0, num: "0.0"},
		{v: 0.01234, num: "0.01"},
		{v: 3.14159, num: "3.14"},
		{v: 42.42, num: "42.4"},
		{v: 123.456, num: "123"},
		{v: 1234567.8, num: "1,234,568"},
		{v: -18928, num: "-18,928"},
	} {
		if got := figure(tc.v); got != tc.num {
			t.Errorf("figure(%v) = %q, want %q", tc.v, got, tc.num)
		}
	}
}

const rawStorage = `cpu: AMD EPYC
cores: 2
goos: linux
goarch: amd64
strace: strace 6.1
disk: /tmp (ext4 on /dev/vda)
BenchmarkBroker/mochi/persist-qos1-100x3 1 400 acks/s 180000 disk-B/msg 70000 disk-KiB/s 100 stored-% 900 replay-msgs/s
BenchmarkBroker/mochi/persist-qos1-100x3-traced 1 300 acks/s 3000 fsyncs/s 10 fsyncs/msg
BenchmarkBroker/mosquitto/persist-qos1-100x3 1 80000 acks/s 0 disk-B/msg 0 disk-KiB/s 100 stored-% 250000 replay-msgs/s
BenchmarkBroker/mosquitto/persist-qos1-100x3-traced 1 78000 acks/s 0 fsyncs/s 0 fsyncs/msg
`

func TestStorageSummary(t *testing.T) {
	for _, tc := range []struct {
		name string
		raw  string
		want []string
	}{
		{
			name: "targets met",
			raw: rawStorage + `BenchmarkBroker/fieldgate/persist-qos1-100x3 1 100000 acks/s 1000 disk-B/msg 97000 disk-KiB/s 100 stored-% 300000 replay-msgs/s
BenchmarkBroker/fieldgate/persist-qos1-100x3-traced 1 90000 acks/s 540 fsyncs/s 0.006 fsyncs/msg
`,
			want: []string{
				"- State files: /tmp (ext4 on /dev/vda)",
				"| PUBACKs/s ≥ 5× mochi + bolt at 100 publishers | ✓ lowest 250.0× (persist-qos1-100x3) |",
				"| fsyncs per message ≤ 1/10 at 100 publishers | ✓ persist-qos1-100x3 0.006 per message (one per 167 messages) |",
				"| `persist-qos1-100x3` | 100,000 | 400 | 80,000 | 250.0× | 1.25× |",
				"| | fsyncs per message (strace) | 0.006 | 10 | 0.0 |",
				"| | PUBACKs/s (strace) | 90,000 | 300 | 78,000 |",
				"| `persist-qos1-100x3` | disk bytes per message | 1,000 | 180,000 | 0.0 |",
			},
		},
		{
			name: "targets missed",
			raw: rawStorage + `BenchmarkBroker/fieldgate/persist-qos1-100x3 1 1600 acks/s
BenchmarkBroker/fieldgate/persist-qos1-100x3-traced 1 1500 acks/s 600 fsyncs/s 0.4 fsyncs/msg
`,
			want: []string{
				"| PUBACKs/s ≥ 5× mochi + bolt at 100 publishers | **✗ persist-qos1-100x3 4.00×** |",
				"| fsyncs per message ≤ 1/10 at 100 publishers | **✗ persist-qos1-100x3 0.4 per message (one per 2.50 messages)** |",
				"| | disk KiB/s | n/a | 70,000 | 0.0 |",
			},
		},
		{
			name: "no strace, fewer publishers",
			raw: strings.ReplaceAll(rawStorage, "100x3", "10x3") + `BenchmarkBroker/fieldgate/persist-qos1-10x3 1 40000 acks/s
`,
			want: []string{
				"| PUBACKs/s ≥ 5× mochi + bolt at 10 publishers (the most measured; the target is for 100) | ✓ lowest 100.0× (persist-qos1-10x3) |",
				"| fsyncs per message ≤ 1/10 at 10 publishers (the most measured; the target is for 100) | not measured: no run under strace (strace 6.1) |",
				"| | fsyncs/s (strace) | – | 3,000 | 0.0 |",
			},
		},
		{
			name: "fieldgate skipped",
			raw:  "# skip fieldgate: make build failed\n" + rawStorage,
			want: []string{
				"| PUBACKs/s ≥ 5× mochi + bolt at 100 publishers | not measured: fieldgate skipped (make build failed) |",
				"| fsyncs per message ≤ 1/10 at 100 publishers | not measured: fieldgate skipped (make build failed) |",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			md := checkSummary(t, "storage", "results/storage-amd64.txt", tc.raw, tc.want, nil)
			if strings.Contains(md, "-traced`") {
				t.Errorf("a traced run has a row of its own:\n%s", md)
			}
		})
	}
}
