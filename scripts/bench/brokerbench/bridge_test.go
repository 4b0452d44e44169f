package brokerbench

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// waitEvent waits until the events file has a line starting with name.
func waitEvent(t *testing.T, file, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(file)
		for line := range strings.Lines(string(b)) {
			if strings.HasPrefix(line, name+" ") {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no %q event in %s", name, file)
}

// TestPublishAndCount publishes numbered messages and a probe straight to
// a broker and counts them with Count, as the reference run of
// bench-bridge.sh does (no outage).
func TestPublishAndCount(t *testing.T) {
	addr := startMochi(t)
	ctx := context.Background()
	events := filepath.Join(t.TempDir(), "events")
	const n = 500
	type outcome struct {
		res Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := Count(ctx, CountConfig{
			Broker: "mochi", Scenario: "direct", Addr: addr, ClientID: "counter", N: n,
			Idle: 2 * time.Second, Limit: 20 * time.Second, Events: events, NoOutage: true,
			UpstreamPIDFile: writePID(t), Keepalive: time.Minute,
		})
		done <- outcome{res, err}
	}()
	waitEvent(t, events, EventSubscribed)
	if err := PublishOne(ctx, addr, BridgeProbeTopic, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, events, EventProbe)

	cfg := DefaultConfig()
	cfg.Broker, cfg.Addr, cfg.Window, cfg.PID = "mochi", addr, 8, os.Getpid()
	pub, err := PublishN(ctx, &cfg, "outage", n, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(pub.Notes) > 0 {
		t.Errorf("publish notes: %q", pub.Notes)
	}
	if v, ok := metric(pub, "acks/s"); !ok || v <= 0 {
		t.Errorf("publish: acks/s %v, %t", v, ok)
	}
	if _, ok := metric(pub, "disk-B/msg"); !ok {
		t.Errorf("publish: no disk-B/msg with a PID: %v", pub.Metrics)
	}

	var o outcome
	select {
	case o = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Count did not end")
	}
	if o.err != nil {
		t.Fatal(o.err)
	}
	for unit, want := range map[string]float64{"delivered": n, "delivered-%": 100, "dups": 0} {
		if v, ok := metric(o.res, unit); !ok || v != want {
			t.Errorf("count %s = %v (%t), want %v", unit, v, ok, want)
		}
	}
	for _, unit := range []string{"msgs/s", "drain-s", "upstream-cpu-%"} {
		if _, ok := metric(o.res, unit); !ok {
			t.Errorf("count: no %s in %v", unit, o.res.Metrics)
		}
	}
	if len(o.res.Notes) > 0 {
		t.Errorf("count notes: %q", o.res.Notes)
	}
	waitEvent(t, events, EventDone)
}

// writePID writes this process's id to a file, standing in for a broker's.
func writePID(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "pid")
	if err := os.WriteFile(f, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func metric(r Result, unit string) (float64, bool) {
	for _, m := range r.Metrics {
		if m.Unit == unit {
			return m.Value, true
		}
	}
	return 0, false
}

// TestCountHandle feeds the counter packets directly: numbers are told
// apart, repeats counted as duplicates, and bad payloads and other topics
// do not count.
func TestCountHandle(t *testing.T) {
	k := &count{cc: CountConfig{N: 4}, seen: make([]uint64, 1)}
	pub := func(topic string, id uint64, size int) *packets.Packet {
		p := make([]byte, size)
		if size >= 8 {
			binary.BigEndian.PutUint64(p, id)
		}
		return &packets.Packet{TopicName: topic, Payload: p}
	}
	ctx := context.Background()
	for _, pk := range []*packets.Packet{
		pub("bench/out/0", 0, 64),
		pub("bench/out/1", 3, 64),
		pub("bench/out/0", 0, 64), // again
		pub("bench/out/2", 4, 64), // beyond N
		pub("bench/out/2", 1, 4),  // too short for a number
		pub("bench/live/0", 2, 64),
		pub("bench/probe", 2, 8),
		pub("bench/out/1", 2, 8),
	} {
		k.handle(ctx, pk)
	}
	if k.distinct != 3 || k.dups != 1 || k.bad != 2 || k.live != 1 || !k.probed {
		t.Errorf("distinct %d dups %d bad %d live %d probed %t; want 3 1 2 1 true", k.distinct, k.dups, k.bad, k.live, k.probed)
	}
	if k.first.IsZero() || k.last.Before(k.first) {
		t.Errorf("first %v last %v", k.first, k.last)
	}
}

func TestProcessCPU(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	d, err := processCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if d < 0 {
		t.Errorf("processCPU = %v", d)
	}
	if _, err := processCPU(-1); err == nil {
		t.Error("processCPU(-1) did not fail")
	}
}

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
			s := NewSummary()
			if err := s.Read("results/bridge-amd64.txt", strings.NewReader(tc.raw)); err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			if err := s.WriteBridgeMarkdown(&b); err != nil {
				t.Fatal(err)
			}
			md := b.String()
			for _, w := range tc.want {
				if !strings.Contains(md, w) {
					t.Errorf("summary lacks %q\n%s", w, md)
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(md, w) {
					t.Errorf("summary has %q\n%s", w, md)
				}
			}
		})
	}
}
