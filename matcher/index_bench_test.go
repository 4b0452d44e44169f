package matcher

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
)

// benchFilters returns n device filters of depth 5, a fraction of them
// wildcards in a few fleet-like shapes, and topics that match them.
func benchFilters(n int, wild float64) (filters, topics []string) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range n {
		t := fmt.Sprintf("d%d/room%d/rack%d/sensor%d/temp", i, i%7, i%13, i%5)
		f := t
		if rng.Float64() < wild {
			switch i % 3 {
			case 0:
				f = fmt.Sprintf("d%d/+/rack%d/sensor%d/temp", i, i%13, i%5)
			case 1:
				f = fmt.Sprintf("d%d/room%d/#", i, i%7)
			default:
				f = fmt.Sprintf("d%d/room%d/rack%d/+/+", i, i%7, i%13)
			}
		}
		filters = append(filters, f)
		if i%(n/1000+1) == 0 {
			topics = append(topics, t)
		}
	}
	return filters, topics
}

func heapInUse() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkMatch times Match on fleet-like indexes and reports the heap the
// index holds per subscription. Each index is built once, outside the timed
// function, so the ramp-up runs neither rebuild it nor skew the heap figure.
// The side-by-side comparison with other indexes is in scripts/bench.
func BenchmarkMatch(b *testing.B) {
	for _, n := range []int{1_000, 100_000, 1_000_000} {
		for _, wild := range []float64{0, 0.1, 0.5} {
			filters, topics := benchFilters(n, wild)
			before := heapInUse()
			x := NewIndex()
			for i, f := range filters {
				if _, err := x.Subscribe(Handle(i/8+1), f, 1, 0); err != nil {
					b.Fatal(err)
				}
			}
			perSub := float64(heapInUse()-before) / float64(n)
			b.Run(fmt.Sprintf("subs=%d/wild=%.0f", n, wild*100), func(b *testing.B) {
				var r Result
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					x.Match(topics[i%len(topics)], NoHandle, &r)
					if len(r.Deliveries) == 0 {
						b.Fatal("no delivery")
					}
				}
				b.ReportMetric(perSub, "bytes/sub")
			})
			runtime.KeepAlive(x)
		}
	}
}

func BenchmarkMatchFanout(b *testing.B) {
	x := NewIndex()
	for h := range 10_000 {
		x.Subscribe(Handle(h+1), "plant/line1/alarm", 1, 0)
	}
	x.Subscribe(1, "plant/+/alarm", 2, 3)
	var r Result
	b.ReportAllocs()
	for b.Loop() {
		x.Match("plant/line1/alarm", NoHandle, &r)
	}
	if len(r.Deliveries) != 10_000 {
		b.Fatal(len(r.Deliveries))
	}
}

func BenchmarkMatchParallel(b *testing.B) {
	filters, topics := benchFilters(100_000, 0.1)
	x := NewIndex()
	for i, f := range filters {
		x.Subscribe(Handle(i/8+1), f, 1, 0)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var r Result
		for i := 0; pb.Next(); i++ {
			x.Match(topics[i%len(topics)], NoHandle, &r)
		}
	})
}

func BenchmarkSubscribe(b *testing.B) {
	filters, _ := benchFilters(100_000, 0.1)
	x := NewIndex()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		f := filters[i%len(filters)]
		x.Subscribe(Handle(i%5000+1), f, 1, 0)
		if i%2 == 1 {
			x.Unsubscribe(Handle(i%5000+1), f)
		}
	}
}
