package brokerbench

import (
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
