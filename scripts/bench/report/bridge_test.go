package report

import (
	"strings"
	"testing"
)

const rawBridge = `cpu: AMD EPYC
cores: 2
goos: linux
goarch: amd64
go: go1.26.8
fieldgate: fieldgate abc123 (commit abc123) go1.26.8 linux/amd64
mosquitto: 2.0.11
mosquitto-autosave: 1
inflight: 32
paced-rate: 500
n: 100000
settings: COUNT=3 N=100000 PUBS=10 WINDOW=8 PAYLOAD=64 B PACED_RATE=500 AUTOSAVE=1s INFLIGHT=32 LIVE=1 IDLE=10s CRASH_LATE=3s
BenchmarkBroker/upstream/direct 1 100 delivered-% 100000 delivered 0 dups 44000 msgs/s 77 upstream-cpu-%
BenchmarkBroker/fieldgate/outage 1 57000 acks/s 1300 disk-B/msg 124 disk-MiB 1.75 publish-s
BenchmarkBroker/fieldgate/drain 1 100 delivered-% 100000 delivered 0 dups 33000 msgs/s 3.0 drain-s 60 upstream-cpu-% 80 broker-cpu-%
BenchmarkBroker/fieldgate/drain 1 100 delivered-% 100000 delivered 2 dups 35000 msgs/s 2.9 drain-s
BenchmarkBroker/fieldgate/crash 1 100 delivered-% 100000 delivered 0 dups
BenchmarkBroker/fieldgate/crash-after3s 1 100 delivered-% 100000 delivered 0 dups
BenchmarkBroker/fieldgate/drain-rate500 1 100 delivered-% 100000 delivered 0 dups 500 msgs/s 200 drain-s
BenchmarkBroker/mosquitto/outage 1 90000 acks/s 0 disk-B/msg 0 disk-MiB 1.1 publish-s
BenchmarkBroker/mosquitto/drain 1 100 delivered-% 100000 delivered 0 dups 50000 msgs/s 2.0 drain-s 75 upstream-cpu-% 60 broker-cpu-%
# warn mosquitto/crash: 0 of 100000 acknowledged messages arrived upstream (nothing new for 10s)
BenchmarkBroker/mosquitto/crash 1 0 delivered-% 0 delivered 0 dups
BenchmarkBroker/mosquitto/crash-after3s 1 100 delivered-% 100000 delivered 0 dups
`

func TestBridgeSummary(t *testing.T) {
	for _, tc := range []struct {
		name    string
		raw     string
		want    []string
		wantNot []string
	}{
		{
			name: "target missed",
			raw:  rawBridge,
			want: []string{
				"# Bridging through an outage: fieldgate vs Mosquitto's bridge",
				"| drain ≥ 2× Mosquitto's bridge (messages per second from the first to the last message upstream) | **✗ 0.68× (fieldgate 34,000 msgs/s, Mosquitto 50,000)** |",
				"| fieldgate delivers all 100,000 acknowledged messages after the outage, every run | ✓ 2 of 2 runs (delivered 100,000, 100,000) |",
				"**The target is not met**: fieldgate's bridge drained the backlog at 0.68× the rate of Mosquitto's (34,000 against 50,000 messages a second).",
				"was busy 75% of the time: 15.0 µs of CPU per message, so even with a whole core to itself it would pass at most about 66,667 messages a second.",
				"the target cannot be shown with this setup",
				"| drain, messages/s | 34,000 (33,000, 35,000) | 50,000 | 0.68× |",
				"| `crash`: delivered | 100,000 | 0 | – |",
				"| duplicates | 1 (0, 2) | 0 | – |",
				"| disk bytes per queued message | 1,300 | 0.0 | – |",

				"| `crash-after3s`: delivered, % | 100 | 100 | 1.00× |",
				"## Pacing: fieldgate at its default rate",
				"| drain, messages/s | 500 |",
				"got 44,000 messages a second through",
				"- mosquitto/crash: 0 of 100000 acknowledged messages arrived upstream (nothing new for 10s)",
			},
			wantNot: []string{"| upstream |", "upstream ÷"},
		},
		{
			name: "fieldgate lost messages after a crash",
			raw: strings.Replace(rawBridge, "fieldgate/crash 1 100 delivered-% 100000 delivered",
				"fieldgate/crash 1 99.9 delivered-% 99900 delivered", 1),
			want: []string{
				"| fieldgate delivers all 100,000 acknowledged messages after SIGKILL right after the last PUBACK, every run | **✗ 1 of 1 runs fell short: delivered 99,900** |",
			},
		},
		{
			name: "target met",
			raw:  strings.ReplaceAll(rawBridge, "50000 msgs/s", "15000 msgs/s"),
			want: []string{
				"| drain ≥ 2× Mosquitto's bridge (messages per second from the first to the last message upstream) | ✓ 2.27× (fieldgate 34,000 msgs/s, Mosquitto 15,000) |",
				"**The target is met**: fieldgate's bridge drained the backlog 2.27× as fast as Mosquitto's.",
			},
			wantNot: []string{"cannot be shown"},
		},
		{
			name: "no mosquitto",
			raw:  rawHeader + "# skip mosquitto: not installed\nBenchmarkBroker/fieldgate/drain 1 100 delivered-% 10 delivered 0 dups 30000 msgs/s\n",
			want: []string{
				"| drain ≥ 2× Mosquitto's bridge (messages per second from the first to the last message upstream) | not measured: mosquitto skipped (not installed) |",
				"**Whether the target is met cannot be said: a drain figure is missing.**",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkSummary(t, "bridge", "results/bridge-amd64.txt", tc.raw, tc.want, tc.wantNot)
		})
	}
}
