package storage

import (
	"fmt"
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
