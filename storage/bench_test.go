package storage

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fieldgate/fieldgate/matcher"
)

// BenchmarkCommit: each op is one durable 200-byte Enqueue batch, its
// committer waiting for it; with more committers, more batches share a
// transaction and its fsyncs.
func BenchmarkCommit(b *testing.B) {
	for _, committers := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("committers=%d", committers), func(b *testing.B) {
			db := openTemp(b, Options{})
			payload := make([]byte, 200)
			var next atomic.Int64
			var wg sync.WaitGroup
			before := db.CommitStats()
			b.ReportAllocs()
			b.ResetTimer()
			for w := range committers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					id := fmt.Sprintf("client-%03d", w)
					for {
						seq := next.Add(1)
						if seq > int64(b.N) {
							return
						}
						var batch Batch
						batch.Enqueue(id, &Queued{Seq: uint64(seq), Msg: Message{Topic: "bench/t", Payload: payload, QoS: 1}})
						if err := db.CommitWait(&batch); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			commits := float64(db.CommitStats().Commits - before.Commits)
			b.ReportMetric(commits/float64(b.N), "commits/op")
			// bbolt syncs twice per transaction: the pages, then the meta page.
			b.ReportMetric(2*commits/float64(b.N), "fsyncs/op")
		})
	}
}

// BenchmarkMatchRetained looks up retained messages among 10,000 topics:
// a filter with a narrow literal prefix seeks to it; one that starts with
// a wildcard has no prefix and reads them all.
func BenchmarkMatchRetained(b *testing.B) {
	db := openTemp(b, Options{})
	quantities := []string{"temp", "humidity", "pressure", "co2", "light", "soil", "battery", "rssi", "voltage", "status"}
	var batch Batch
	for gh := range 10 {
		for node := range 100 {
			for _, q := range quantities {
				batch.SetRetained(&Message{Topic: fmt.Sprintf("plant/gh-%02d/node-%03d/%s", gh, node, q), Payload: []byte(`{"value":21.5}`), Retain: true})
			}
		}
	}
	if err := db.CommitWait(&batch); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name, filter string
		want         int
	}{
		{"prefix", "plant/gh-07/node-042/+", 10},
		{"prefix-deep", "plant/gh-07/#", 1000},
		{"exact", "plant/gh-07/node-042/temp", 1},
		{"no-prefix", "+/gh-07/node-042/+", 10},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				n := 0
				if err := db.MatchRetained(bc.filter, matcher.Matches, func(*Message) { n++ }); err != nil {
					b.Fatal(err)
				}
				if n != bc.want {
					b.Fatalf("%d matches, want %d", n, bc.want)
				}
			}
			b.ReportMetric(float64(bc.want), "matches/op")
		})
	}
}

// BenchmarkVerifyFile reads the page structure of a 25 MB state file, as
// every Open does before bbolt trusts it.
func BenchmarkVerifyFile(b *testing.B) {
	db := openTemp(b, Options{})
	payload := make([]byte, 200)
	for c := range 100 {
		var batch Batch
		id := fmt.Sprintf("client-%03d", c)
		for seq := range 1000 {
			batch.Enqueue(id, &Queued{Seq: uint64(seq), Msg: Message{Topic: "bench/t", Payload: payload, QoS: 1}})
		}
		if err := db.CommitWait(&batch); err != nil {
			b.Fatal(err)
		}
	}
	st, err := db.Stats()
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(st.Size)
	b.ReportAllocs()
	for b.Loop() {
		if err := verifyFile(db.Path(), st.PageSize); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOutboxPutCommit: each op is one durable commit of outbox puts
// of 200-byte messages, as the broker writes them: one put a batch, a
// batch of 100 (a burst, or a bridge's catch-up), or single-put batches
// from 100 publishers at once, which the committer groups.
func BenchmarkOutboxPutCommit(b *testing.B) {
	payload := make([]byte, 200)
	entry := func(seq uint64) *OutboxEntry {
		return &OutboxEntry{Seq: seq, Route: 1, Added: int64(seq), Msg: Message{Topic: "site/gh-1/temp", Payload: payload, QoS: 1}}
	}
	for _, bc := range []struct {
		name             string
		puts, committers int
	}{
		{"puts=1", 1, 1},
		{"puts=100", 100, 1},
		{"committers=100", 1, 100},
	} {
		b.Run(bc.name, func(b *testing.B) {
			db := openTemp(b, Options{})
			var next atomic.Uint64
			var wg sync.WaitGroup
			before := db.CommitStats()
			b.ReportAllocs()
			b.ResetTimer()
			for range bc.committers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						first := next.Add(uint64(bc.puts)) - uint64(bc.puts) + 1
						if first > uint64(b.N*bc.puts) {
							return
						}
						var batch Batch
						for seq := first; seq < first+uint64(bc.puts); seq++ {
							batch.OutboxPut("cloud", entry(seq))
						}
						if err := db.CommitWait(&batch); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			entries := float64(b.N * bc.puts)
			b.ReportMetric(entries/b.Elapsed().Seconds(), "entries/s")
			b.ReportMetric(float64(db.CommitStats().Commits-before.Commits)/entries, "commits/entry")
		})
	}
}

// BenchmarkOutboxScan reads an outbox of 10,000 entries of 200-byte
// messages: all of it, as a bridge does after a long outage, or a window
// of 100, as it does while connected. Every entry is the caller's own
// copy: three allocations (the entry, its topic, its payload).
func BenchmarkOutboxScan(b *testing.B) {
	const n = 10_000
	db := openTemp(b, Options{})
	payload := make([]byte, 200)
	var batch Batch
	for seq := uint64(1); seq <= n; seq++ {
		batch.OutboxPut("cloud", &OutboxEntry{Seq: seq, Route: 1, Added: int64(seq), Msg: Message{Topic: "site/gh-1/temp", Payload: payload, QoS: 1}})
	}
	if err := db.CommitWait(&batch); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name  string
		after uint64
		max   int
	}{
		{"all", 0, 0},
		{"window=100", n / 2, 100},
	} {
		b.Run(bc.name, func(b *testing.B) {
			want := n - int(bc.after)
			if bc.max > 0 {
				want = bc.max
			}
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			mallocs := ms.Mallocs
			b.ReportAllocs()
			for b.Loop() {
				got := 0
				err := db.OutboxScan("cloud", bc.after, bc.max, func(*OutboxEntry) bool { got++; return true })
				if err != nil || got != want {
					b.Fatalf("%d entries, %v; want %d", got, err, want)
				}
			}
			runtime.ReadMemStats(&ms)
			entries := float64(b.N * want)
			b.ReportMetric(entries/b.Elapsed().Seconds(), "entries/s")
			b.ReportMetric(float64(ms.Mallocs-mallocs)/entries, "allocs/entry")
		})
	}
}
