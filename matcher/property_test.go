package matcher

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// propertySeeds returns the seeds to run: MATCHER_SEED alone when set (to
// replay a failure), otherwise a fixed seed and one taken from the clock.
func propertySeeds(t *testing.T) []uint64 {
	if s := os.Getenv("MATCHER_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("MATCHER_SEED=%q: %v", s, err)
		}
		return []uint64{seed}
	}
	return []uint64{20240601, uint64(time.Now().UnixNano())}
}

// propLevels are the topic levels random filters and topics draw from: empty
// levels, pairs whose bytes are permutations of each other, '$' levels and
// multi-byte text.
var propLevels = []string{"", "a", "b", "c", "ab", "ba", "$x", "x$", "日"}

type propGen struct {
	rng *rand.Rand
}

func (g propGen) level() string { return propLevels[g.rng.IntN(len(propLevels))] }

func (g propGen) depth() int {
	if g.rng.IntN(10) == 0 {
		return 9 + g.rng.IntN(5) // deeper than a per-level hash can hold
	}
	return 1 + g.rng.IntN(4)
}

// filter returns a random valid non-shared filter.
func (g propGen) filter() string {
	n := g.depth()
	parts := make([]string, n)
	for i := range parts {
		if g.rng.IntN(4) == 0 {
			parts[i] = "+"
		} else {
			parts[i] = g.level()
		}
	}
	if g.rng.IntN(6) == 0 {
		parts[n-1] = "#"
	}
	if f := strings.Join(parts, "/"); f != "" {
		return f
	}
	return "/" // a lone empty level is not a filter
}

// anyFilter returns a random valid filter, sometimes shared.
func (g propGen) anyFilter() string {
	f := g.filter()
	if g.rng.IntN(5) == 0 {
		return "$share/g" + strconv.Itoa(g.rng.IntN(2)) + "/" + f
	}
	return f
}

// topic returns a random topic name, half the time one that filter matches.
func (g propGen) topic(filters []string) string {
	if len(filters) > 0 && g.rng.IntN(2) == 0 {
		_, f, _ := oracleSplitShared(filters[g.rng.IntN(len(filters))])
		return g.instance(f)
	}
	n := g.depth()
	parts := make([]string, n)
	for i := range parts {
		parts[i] = g.level()
	}
	if t := strings.Join(parts, "/"); t != "" {
		return t
	}
	return "/"
}

// instance returns a topic built from filter by filling its wildcards.
func (g propGen) instance(filter string) string {
	var parts []string
	for _, l := range strings.Split(filter, "/") {
		switch l {
		case "+":
			parts = append(parts, g.level())
		case "#":
			for range g.rng.IntN(3) {
				parts = append(parts, g.level())
			}
		default:
			parts = append(parts, l)
		}
	}
	if len(parts) == 0 {
		parts = append(parts, g.level())
	}
	t := strings.Join(parts, "/")
	if t == "" {
		t = "/"
	}
	return t
}

func (g propGen) opts(shared bool) Options {
	o := Options(g.rng.IntN(3))
	if g.rng.IntN(2) == 0 {
		o |= RetainAsPublished
	}
	if !shared && g.rng.IntN(5) == 0 {
		o |= NoLocal
	}
	return o
}

func (g propGen) id() uint32 {
	if g.rng.IntN(2) == 0 {
		return 0
	}
	return uint32(1 + g.rng.IntN(6)) // small, so one session repeats ids
}

// sortedKeys lists the oracle's subscriptions in a fixed order, so picks from
// it replay from the seed.
func (o *oracle) sortedKeys() []oracleKey {
	keys := make([]oracleKey, 0, len(o.flat))
	for k := range o.flat {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b oracleKey) int {
		return cmp.Or(cmp.Compare(a.h, b.h), strings.Compare(a.filter, b.filter))
	})
	return keys
}

func checkCounts(x *Index, o *oracle) error {
	if x.Len() != o.len() {
		return fmt.Errorf("Len %d, want %d", x.Len(), o.len())
	}
	lo, hi := o.filterBounds()
	if f := x.Filters(); f < lo || f > hi {
		return fmt.Errorf("Filters %d, want between %d and %d", f, lo, hi)
	}
	return nil
}

func TestPropertyIndexVsOracle(t *testing.T) {
	for _, seed := range propertySeeds(t) {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
			t.Logf("seed %d (replay with MATCHER_SEED=%d)", seed, seed)
			runProperty(t, seed)
		})
	}
}

func runProperty(t *testing.T, seed uint64) {
	const (
		sessions = 20
		rounds   = 120
		opsPer   = 30
		topicsPr = 40
	)
	g := propGen{rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	x, o := NewIndex(), newOracle()
	pool := make([]string, 40)
	for i := range pool {
		pool[i] = g.anyFilter()
	}
	var r Result
	var delivered, sharedHits, matches int
	for round := range rounds {
		for range opsPer {
			h := Handle(1 + g.rng.IntN(sessions))
			switch op := g.rng.IntN(20); {
			case op < 8: // subscribe
				f := pool[g.rng.IntN(len(pool))]
				if g.rng.IntN(5) == 0 {
					f = g.anyFilter()
				}
				_, _, shared := oracleSplitShared(f)
				opts, id := g.opts(shared), g.id()
				replaced, err := x.Subscribe(h, f, opts, id)
				if err != nil {
					t.Fatalf("round %d: Subscribe(%d, %q): %v", round, h, f, err)
				}
				if want := o.subscribe(h, f, opts, id); replaced != want {
					t.Fatalf("round %d: Subscribe(%d, %q) replaced=%v, want %v", round, h, f, replaced, want)
				}
			case op < 11: // resubscribe an existing subscription with new options
				keys := o.sortedKeys()
				if len(keys) == 0 {
					continue
				}
				k := keys[g.rng.IntN(len(keys))]
				_, _, shared := oracleSplitShared(k.filter)
				opts, id := g.opts(shared), g.id()
				replaced, err := x.Subscribe(k.h, k.filter, opts, id)
				o.subscribe(k.h, k.filter, opts, id)
				if err != nil || !replaced {
					t.Fatalf("round %d: resubscribe(%d, %q) = %v, %v, want true, nil", round, k.h, k.filter, replaced, err)
				}
			case op < 15: // unsubscribe, an existing subscription or maybe not
				hh, f := h, pool[g.rng.IntN(len(pool))]
				if keys := o.sortedKeys(); len(keys) > 0 && g.rng.IntN(2) == 0 {
					k := keys[g.rng.IntN(len(keys))]
					hh, f = k.h, k.filter
				}
				if got, want := x.Unsubscribe(hh, f), o.unsubscribe(hh, f); got != want {
					t.Fatalf("round %d: Unsubscribe(%d, %q) = %v, want %v", round, hh, f, got, want)
				}
			case op < 16: // a session ends: drop all its subscriptions
				for _, k := range o.sortedKeys() {
					if k.h == h {
						if !x.Unsubscribe(k.h, k.filter) {
							t.Fatalf("round %d: Unsubscribe(%d, %q) = false for a live subscription", round, k.h, k.filter)
						}
						o.unsubscribe(k.h, k.filter)
					}
				}
			default:
				online := g.rng.IntN(10) < 7
				x.SetOnline(h, online)
				o.setOnline(h, online)
			}
		}
		if err := checkCounts(x, o); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for range topicsPr {
			topic := g.topic(pool)
			pub := NoHandle
			if g.rng.IntN(3) > 0 {
				pub = Handle(1 + g.rng.IntN(sessions))
			}
			e, err := o.match(topic, pub)
			if err != nil {
				t.Fatal(err)
			}
			x.Match(topic, pub, &r)
			if err := verify(e, &r, o.offline); err != nil {
				t.Fatalf("round %d: Match(%q, publisher %d): %v\ngot %+v\nsubscriptions %v", round, topic, pub, err, r.Deliveries, o.sortedKeys())
			}
			matches++
			if len(r.Deliveries) > 0 {
				delivered++
			}
			if len(e.groups) > 0 {
				sharedHits++
			}
		}
	}
	t.Logf("%d matches, %d with deliveries, %d with shared groups", matches, delivered, sharedHits)
	if delivered < matches/4 || sharedHits < matches/20 {
		t.Errorf("the generator is not exercising the index: %d of %d matches delivered, %d shared", delivered, matches, sharedHits)
	}
	// Drain: an index emptied subscription by subscription is empty.
	for _, k := range o.sortedKeys() {
		if !x.Unsubscribe(k.h, k.filter) {
			t.Fatalf("drain: Unsubscribe(%d, %q) = false", k.h, k.filter)
		}
		o.unsubscribe(k.h, k.filter)
	}
	if x.Len() != 0 || x.Filters() != 0 {
		t.Fatalf("drained: Len %d Filters %d", x.Len(), x.Filters())
	}
	for range 50 {
		topic := g.topic(pool)
		if x.Match(topic, NoHandle, &r); len(r.Deliveries) != 0 {
			t.Fatalf("drained: Match(%q) = %+v", topic, r.Deliveries)
		}
	}
}

func TestPropertyMatches(t *testing.T) {
	for _, seed := range propertySeeds(t) {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
			t.Logf("seed %d (replay with MATCHER_SEED=%d)", seed, seed)
			g := propGen{rand.New(rand.NewPCG(seed, ^seed))}
			hits := 0
			for range 5000 {
				f := g.filter()
				topic := g.topic(nil)
				if g.rng.IntN(2) == 0 {
					topic = g.instance(f)
				}
				want := oracleMatches(f, topic)
				if got := Matches(f, topic); got != want {
					t.Fatalf("Matches(%q, %q) = %v, want %v", f, topic, got, want)
				}
				if want {
					hits++
				}
			}
			if hits < 1000 {
				t.Errorf("only %d of 5000 random pairs matched; the generator is not exercising matches", hits)
			}
		})
	}
}

// TestConcurrentMatch runs readers against a writer that churns unrelated and
// overlapping subscriptions; a stable subscription must always be delivered.
func TestConcurrentMatch(t *testing.T) {
	x := NewIndex()
	if _, err := x.Subscribe(1, "s/t", 1, 100); err != nil {
		t.Fatal(err)
	}
	if _, err := x.Subscribe(2, "$share/g/s/+", 0, 0); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var r Result
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				x.Match("s/t", NoHandle, &r)
				var plain, shared bool
				for i, d := range r.Deliveries {
					if d.Handle == 1 && !d.Shared {
						plain = d.Opts.QoS() >= 1 && slices.Contains(r.IDs(i, nil), 100)
					}
					shared = shared || d.Shared
				}
				if !plain || !shared {
					errs <- fmt.Sprintf("reader %d, call %d: stable subscriptions missing: %+v", w, n, r.Deliveries)
					return
				}
			}
		}()
	}
	filters := []string{"s/t", "s/+", "#", "s/#", "+/t", "$share/g/s/+", "$share/h/s/t", "a/b"}
	deadline := time.Now().Add(300 * time.Millisecond)
	for i := 0; time.Now().Before(deadline); i++ {
		h := Handle(3 + i%7)
		f := filters[i%len(filters)]
		if i%3 == 2 {
			x.Unsubscribe(h, f)
		} else if _, err := x.Subscribe(h, f, Options(i%3), uint32(i%5)); err != nil {
			t.Fatal(err)
		}
		x.SetOnline(h, i%4 != 0)
	}
	close(stop)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}
