package matcher

import (
	"math/rand/v2"
	"strings"
	"testing"
)

func TestOverlaps(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"devices/+/telemetry", "devices/#", true},
		{"devices/+/telemetry", "devices/dev42/telemetry", true},
		{"devices/+/telemetry", "devices/+/status", false},
		{"a/#", "a", true}, // '#' matches its parent level
		{"a/+", "a", false},
		{"a/b", "a/b/c", false},
		{"+/+", "a/b", true},
		{"#", "anything/at/all", true},
		{"a/b/#", "a/c/#", false},
		{"a/+", "+/b", true},
		{"a", "a", true},
		{"a//b", "a/+/b", true},
		{"/", "+/+", true},
		// [MQTT-4.7.2-1]: a leading wildcard never reaches a '$' topic.
		{"#", "$SYS/#", false},
		{"#", "$SYS", false},
		{"+/x", "$SYS/x", false},
		{"+/#", "$SYS/x", false},
		{"$SYS/#", "$SYS/+", true},
		{"$SYS/#", "$SYS", true},
		{"a/+", "a/$x", true}, // only the first level is special
		// [MQTT-4.7.3-1]: the empty topic, the parent "/#" names, is no topic.
		{"+", "/#", false},
		{"#", "/#", true},   // "/a"
		{"+/#", "/#", true}, // "/"
		{"+", "+/#", true},
		// Shared filters are compared as written.
		{"#", "$share/g/x", false},
		{"$share/g/+", "$share/g/#", true},
		{"$share/g/x", "x", false},
	}
	for _, tt := range tests {
		for _, err := range []error{ValidateFilter(tt.a), ValidateFilter(tt.b)} {
			if err != nil {
				t.Fatalf("test filter: %v", err)
			}
		}
		if got := Overlaps(tt.a, tt.b); got != tt.want {
			t.Errorf("Overlaps(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
		if got := Overlaps(tt.b, tt.a); got != tt.want {
			t.Errorf("Overlaps(%q, %q) = %v, want %v (not symmetric)", tt.b, tt.a, got, tt.want)
		}
	}
}

func TestCovers(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"#", "#", true},
		{"#", "a/b/#", true},
		{"#", "+/+", true},
		{"#", "$SYS/#", false},
		{"+/#", "$SYS/x", false},
		{"$SYS/#", "$SYS/x/#", true},
		{"$SYS/+", "$SYS/x", true},
		{"$SYS/#", "#", false},
		{"+", "$SYS", false},
		{"a/#", "a", true},
		{"a/#", "a/#", true},
		{"a/+", "a", false},
		{"a/+", "a/#", false},
		{"a/+", "a/+", true},
		{"a/+", "a/b", true},
		{"a/b", "a/+", false},
		{"a/b", "a/b/#", false},
		{"a/+/c", "a/+/c", true},
		{"a//b", "a/+/b", false},
		{"a/+/b", "a//b", true},
		{"a", "a/#", false},
		{"+", "a/b", false},
		// No topic has zero levels, so "#" and "+/#" match the same topics.
		{"+/#", "#", true},
		{"#", "+/#", true},
		{"+/+/#", "#", false},
		{"+", "#", false},
		// No topic is empty, so "/#" matches what "/+/#" matches.
		{"/+/#", "/#", true},
		{"+/+/#", "/#", true},
		{"/#", "/+/#", true},
		{"/#", "/", true},
		{"+", "/#", false},
		{"+/#", "+", true},
		{"+", "+/#", false},
		// Shared filters are compared as written.
		{"$share/g/#", "$share/g/x", true},
		{"#", "$share/g/x", false},
		{"$share/g/#", "x", false},
	}
	for _, tt := range tests {
		for _, err := range []error{ValidateFilter(tt.a), ValidateFilter(tt.b)} {
			if err != nil {
				t.Fatalf("test filter: %v", err)
			}
		}
		if got := Covers(tt.a, tt.b); got != tt.want {
			t.Errorf("Covers(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
}

// algebraLevels are the literal levels of the exhaustive check: distinct
// literals, the empty level and a '$' level. Topics add algebraFresh, a
// level no filter names, to stand for every other level a '+' or '#' can
// take.
var algebraLevels = []string{"a", "b", "", "$x"}

const algebraFresh = "z"

// namesUpTo lists every topic or filter of one to depth levels, each level
// one of levels, the last one also one of last; the empty name, which is
// neither, is left out.
func namesUpTo(depth int, levels []string, last ...string) []string {
	var out []string
	layer := []string{""}
	for d := 1; d <= depth; d++ {
		var next []string
		for _, prefix := range layer {
			for k, l := range append(levels[:len(levels):len(levels)], last...) {
				name := l
				if d > 1 {
					name = prefix + "/" + l
				}
				if name != "" {
					out = append(out, name)
				}
				if k < len(levels) {
					next = append(next, name)
				}
			}
		}
		layer = next
	}
	return out
}

// filtersUpTo lists every valid non-shared filter of up to depth levels
// over algebraLevels.
func filtersUpTo(depth int) []string {
	return namesUpTo(depth, append(algebraLevels[:len(algebraLevels):len(algebraLevels)], "+"), "#")
}

// topicsUpTo lists every valid topic of up to depth levels over
// algebraLevels and algebraFresh.
func topicsUpTo(depth int) []string {
	return namesUpTo(depth, append(algebraLevels[:len(algebraLevels):len(algebraLevels)], algebraFresh))
}

// TestAlgebraExhaustive checks Overlaps and Covers for every pair of
// filters of up to three levels against the oracle's matching of every
// topic of up to four. That decides them exactly: a topic both filters
// match (or one b matches and a does not) stays one when each level no
// filter names becomes algebraFresh and it is cut to one level more than
// the filters have, so if such a topic exists, one is in the list.
func TestAlgebraExhaustive(t *testing.T) {
	filters, topics := filtersUpTo(3), topicsUpTo(4)
	for _, f := range filters {
		if !oracleValidFilter(f) {
			t.Fatalf("generated invalid filter %q", f)
		}
	}
	words := (len(topics) + 63) / 64
	sets := make([][]uint64, len(filters))
	for i, f := range filters {
		sets[i] = make([]uint64, words)
		for k, topic := range topics {
			if oracleMatches(f, topic) {
				sets[i][k/64] |= 1 << (k % 64)
			}
		}
	}
	// first returns a topic in x and not in y, or "".
	first := func(x, y []uint64) string {
		for w := range x {
			if d := x[w] &^ y[w]; d != 0 {
				for k := w * 64; k < len(topics); k++ {
					if d&(1<<(k%64)) != 0 {
						return topics[k]
					}
				}
			}
		}
		return ""
	}
	none := make([]uint64, words)
	failures := 0
	for i, a := range filters {
		for j, b := range filters {
			both := make([]uint64, words)
			for w := range both {
				both[w] = sets[i][w] & sets[j][w]
			}
			witness := first(both, none)
			if got := Overlaps(a, b); got != (witness != "") {
				t.Errorf("Overlaps(%q, %q) = %v; a topic both match: %q", a, b, got, witness)
				failures++
			}
			outside := first(sets[j], sets[i])
			if got := Covers(a, b); got != (outside == "") {
				t.Errorf("Covers(%q, %q) = %v; a topic the second matches and the first does not: %q", a, b, got, outside)
				failures++
			}
			if failures > 20 {
				t.Fatal("too many failures")
			}
		}
	}
	t.Logf("%d filters, %d pairs, %d topics", len(filters), len(filters)*len(filters), len(topics))
}

// TestAlgebraRandom checks the two functions' promises on deeper filters
// and wider levels than the exhaustive check reaches: a topic both filters
// match means they overlap, and a topic b matches that a does not means a
// does not cover b.
func TestAlgebraRandom(t *testing.T) {
	for _, seed := range propertySeeds(t) {
		g := propGen{rand.New(rand.NewPCG(seed, 1))}
		for range 3000 {
			a, b := g.filter(), g.filter()
			if g.rng.IntN(4) == 0 {
				// Deepen b under a, so that covering pairs come up.
				b = strings.TrimSuffix(strings.TrimSuffix(a, "#"), "/") + "/" + g.filter()
				if strings.HasPrefix(b, "/") && !strings.HasPrefix(a, "/") {
					b = b[1:]
				}
			}
			overlaps, covers := Overlaps(a, b), Covers(a, b)
			if covers && !overlaps {
				t.Fatalf("seed %d: Covers(%q, %q) without Overlaps", seed, a, b)
			}
			if overlaps != Overlaps(b, a) {
				t.Fatalf("seed %d: Overlaps(%q, %q) is not symmetric", seed, a, b)
			}
			if !Covers(a, a) {
				t.Fatalf("seed %d: Covers(%q, itself) = false", seed, a)
			}
			for range 20 {
				topic := g.topic([]string{a, b})
				ma, mb := oracleMatches(a, topic), oracleMatches(b, topic)
				if ma && mb && !overlaps {
					t.Fatalf("seed %d: Overlaps(%q, %q) = false, but both match %q", seed, a, b, topic)
				}
				if mb && !ma && covers {
					t.Fatalf("seed %d: Covers(%q, %q) = true, but only the second matches %q", seed, a, b, topic)
				}
			}
		}
	}
}

// FuzzAlgebra checks Overlaps and Covers on filters decoded from arbitrary
// bytes against topics that fill the filters' wildcards with arbitrary
// levels.
func FuzzAlgebra(f *testing.F) {
	f.Add([]byte{0x01, 3, 4, 0x01, 4, 0, 5, 6, 7, 8})
	f.Add([]byte{0x00, 4, 0x01, 5, 4, 1, 2, 3})
	f.Add([]byte{0x02, 2, 3, 4, 0x00, 11, 1, 2})
	f.Add([]byte{0x01, 2, 4, 0x00, 3, 2, 2, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &fuzzReader{b: data}
		a, b := r.name(false), r.name(false)
		if ValidateFilter(a) != nil || ValidateFilter(b) != nil {
			return
		}
		overlaps, covers := Overlaps(a, b), Covers(a, b)
		if overlaps != Overlaps(b, a) || covers && !overlaps || !Covers(a, a) {
			t.Fatalf("Overlaps(%q, %q) = %v, Covers = %v, reversed %v, itself %v",
				a, b, overlaps, covers, Overlaps(b, a), Covers(a, a))
		}
		for _, f := range []string{a, b, a, b} {
			topic := fillFilter(r, f)
			if ValidateTopic(topic) != nil {
				continue
			}
			ma, mb := oracleMatches(a, topic), oracleMatches(b, topic)
			if ma && mb && !overlaps {
				t.Fatalf("Overlaps(%q, %q) = false, but both match %q", a, b, topic)
			}
			if mb && !ma && covers {
				t.Fatalf("Covers(%q, %q) = true, but only the second matches %q", a, b, topic)
			}
		}
	})
}

// fillFilter makes a topic from filter, each '+' taking one level from r and
// the '#' none to two.
func fillFilter(r *fuzzReader, filter string) string {
	var parts []string
	for _, l := range strings.Split(filter, "/") {
		switch l {
		case "+":
			parts = append(parts, r.level())
		case "#":
			for range r.byte() % 3 {
				parts = append(parts, r.level())
			}
		default:
			parts = append(parts, l)
		}
	}
	return strings.Join(parts, "/")
}
