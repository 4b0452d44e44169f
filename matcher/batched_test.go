package matcher

import (
	"errors"
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

// TestHandleRange checks the packing of handle and options into one word at
// its limits, and that handles beyond it are refused.
func TestHandleRange(t *testing.T) {
	x := NewIndex()
	opts := Options(2) | RetainAsPublished | RetainHandlingMask&0x20
	if _, err := x.Subscribe(MaxHandle, "a/+", opts, 268435455); err != nil {
		t.Fatalf("subscribe MaxHandle: %v", err)
	}
	var r Result
	x.Match("a/b", NoHandle, &r)
	if len(r.Deliveries) != 1 {
		t.Fatalf("got %d deliveries, want 1", len(r.Deliveries))
	}
	d := r.Deliveries[0]
	if d.Handle != MaxHandle || d.Opts != opts || d.ID != 268435455 {
		t.Fatalf("got handle %d opts %#x id %d, want %d %#x %d", d.Handle, d.Opts, d.ID, MaxHandle, opts, 268435455)
	}
	for _, h := range []Handle{NoHandle, MaxHandle + 1} {
		if _, err := x.Subscribe(h, "a/b", 1, 0); !errors.Is(err, ErrNoHandle) {
			t.Errorf("Subscribe(handle %d): got %v, want ErrNoHandle", h, err)
		}
	}
}
