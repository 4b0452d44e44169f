package bridge

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit/mosquitto"
	"github.com/fieldgate/fieldgate/storage"
)

// drainBacklog is the backlog BenchmarkDrain sends: a few seconds of an
// unpaced drain, long enough that the link's start is a small part of it.
const drainBacklog = 5000

// BenchmarkDrain measures how fast a bridge empties a backlog left in its
// state file into a real Mosquitto, unpaced, at QoS 1: the send loop's
// turn per window, the acknowledgements and their batched deletes. One
// iteration is one whole drain, from Start to the last acknowledgement;
// msgs/s is the figure to compare.
func BenchmarkDrain(b *testing.B) {
	up := mosquitto.Start(b, mosquitto.Config{Quiet: true, MaxInflight: 32})
	cfg := parseBridge(b, "bridges:\n  - name: cloud\n"+bridgeYAML(up.Addr(),
		"    rate: 0\n    max_inflight: 32\n    out:\n      - {filter: \"data/#\", topic: \"up/{2}\"}\n"))
	payload := []byte(`{"value":21.46,"unit":"°C","ts":"2026-11-29T12:00:10.269Z"}`)
	b.ReportAllocs()
	var total time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		db, err := storage.Open(filepath.Join(b.TempDir(), fmt.Sprintf("state-%d.db", i)), storage.Options{})
		if err != nil {
			b.Fatal(err)
		}
		var batch storage.Batch
		now := time.Now().UnixNano()
		for seq := uint64(1); seq <= drainBacklog; seq++ {
			batch.OutboxPut("cloud", &storage.OutboxEntry{Seq: seq, Added: now,
				Msg: storage.Message{Topic: "up/t", Payload: payload, QoS: 1}})
		}
		if err := db.CommitWait(&batch); err != nil {
			b.Fatal(err)
		}
		br, err := New(cfg, Options{Device: "gw1", Store: db})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		br.Start(context.Background(), nil)
		waitFor(b, "the backlog drained", func() bool { return br.Stats().Acked >= drainBacklog })
		total += time.Since(start)
		b.StopTimer()
		br.Stop()
		if err := db.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(drainBacklog*b.N)/total.Seconds(), "msgs/s")
}
