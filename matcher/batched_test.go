package matcher

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestBatchedProbesAgree checks that the phased probing Match uses for
// indexes larger than the cache finds exactly what the direct loop finds,
// on an index small enough for the tests, by lowering the threshold.
func TestBatchedProbesAgree(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	level := func() string { return []string{"a", "b", "site", "dev1", "dev2", "", "temp", "x/y"}[rng.IntN(8)] }
	x := NewIndex()
	var topics []string
	for h := 1; h <= 3000; h++ {
		n := 1 + rng.IntN(6)
		var f, topic string
		for i := range n {
			l := level()
			topic += l
			switch rng.IntN(6) {
			case 0:
				f += "+"
			case 1:
				if i == n-1 {
					f += "#"
					break
				}
				f += l
			default:
				f += l
			}
			if i < n-1 {
				f += "/"
				topic += "/"
			}
		}
		if f == "" {
			continue // an empty filter is invalid
		}
		if rng.IntN(10) == 0 {
			f = "$share/g" + fmt.Sprint(rng.IntN(3)) + "/" + f
		}
		if _, err := x.Subscribe(Handle(1+rng.IntN(500)), f, Options(rng.IntN(3)), uint32(rng.IntN(4))); err != nil {
			t.Fatalf("subscribe %q: %v", f, err)
		}
		topics = append(topics, topic)
	}
	var direct, phased Result
	for _, topic := range topics {
		x.batch = cachedCells
		x.Match(topic, NoHandle, &direct)
		x.batch = -1
		x.Match(topic, NoHandle, &phased)
		if len(direct.Deliveries) == 0 && len(phased.Deliveries) == 0 {
			continue
		}
		// Share groups advance between the two calls, so compare the
		// sessions of direct deliveries and the number of shared ones.
		d, p := summary(&direct), summary(&phased)
		if !slices.Equal(d, p) {
			t.Fatalf("topic %q: direct probing gives %v, phased %v", topic, d, p)
		}
	}
}

// summary lists a Result's non-shared deliveries as handle:qos:ids and
// counts its shared ones, in a canonical order.
func summary(r *Result) []string {
	var out []string
	shared := 0
	for i, d := range r.Deliveries {
		if d.Shared {
			shared++
			continue
		}
		ids := r.IDs(i, nil)
		slices.Sort(ids)
		out = append(out, fmt.Sprintf("%d:%d:%v", d.Handle, d.Opts.QoS(), ids))
	}
	slices.Sort(out)
	return append(out, fmt.Sprintf("shared=%d", shared))
}
