package matcher

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

type subSpec struct {
	h      Handle
	filter string
	opts   Options
	id     uint32
}

// build subscribes every spec to a new index and to the oracle.
func build(t *testing.T, subs ...subSpec) (*Index, *oracle) {
	t.Helper()
	x, o := NewIndex(), newOracle()
	for _, s := range subs {
		if _, err := x.Subscribe(s.h, s.filter, s.opts, s.id); err != nil {
			t.Fatalf("Subscribe(%d, %q): %v", s.h, s.filter, err)
		}
		o.subscribe(s.h, s.filter, s.opts, s.id)
	}
	return x, o
}

// expectMatch runs Match and checks it against the oracle.
func expectMatch(t *testing.T, x *Index, o *oracle, topic string, pub Handle) *Result {
	t.Helper()
	e, err := o.match(topic, pub)
	if err != nil {
		t.Fatal(err)
	}
	r := new(Result)
	x.Match(topic, pub, r)
	if err := verify(e, r, o.offline); err != nil {
		t.Errorf("Match(%q, publisher %d): %v\ngot %+v", topic, pub, err, r.Deliveries)
	}
	return r
}

// split separates the non-shared deliveries (by session) from the shared ones.
func split(t *testing.T, r *Result) (normal map[Handle]int, shared []int) {
	t.Helper()
	normal = map[Handle]int{}
	for i, d := range r.Deliveries {
		if d.Shared {
			shared = append(shared, i)
			continue
		}
		if _, dup := normal[d.Handle]; dup {
			t.Errorf("session %d delivered twice: %+v", d.Handle, r.Deliveries)
		}
		normal[d.Handle] = i
	}
	return normal, shared
}

func handles(r *Result, shared bool) []Handle {
	var hs []Handle
	for _, d := range r.Deliveries {
		if d.Shared == shared {
			hs = append(hs, d.Handle)
		}
	}
	slices.Sort(hs)
	return hs
}

// levels joins n levels "l0/l1/..." with the given overrides by index.
func levels(n int, override map[int]string) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf("l%d", i)
		if s, ok := override[i]; ok {
			parts[i] = s
		}
	}
	return strings.Join(parts, "/")
}

type matchCase struct {
	name   string
	filter string
	topic  string
	want   bool
}

func matchCases() []matchCase {
	deep9 := levels(9, nil)
	deep40 := levels(40, nil)
	deep70 := levels(70, nil)
	deep1000 := levels(1000, nil)
	return []matchCase{
		// '+' matches exactly one level.
		{"plus/one level", "a/+", "a/b", true},
		{"plus/not two levels", "a/+", "a/b/c", false},
		{"plus/not zero levels", "a/+", "a", false},
		{"plus/alone one level", "+", "a", true},
		{"plus/alone not two levels", "+", "a/b", false},
		{"plus/two", "+/+", "a/b", true},
		{"plus/middle", "a/+/c", "a/b/c", true},
		{"plus/middle not missing", "a/+/c", "a/c", false},
		{"plus/middle not two", "a/+/c", "a/b/x/c", false},
		{"plus/middle wrong tail", "a/+/c", "a/b/d", false},
		{"plus/leading", "+/b", "a/b", true},
		{"plus/leading wrong tail", "+/b", "a/c", false},
		// '#' matches zero or more trailing levels.
		{"hash/parent level", "a/#", "a", true},
		{"hash/one level", "a/#", "a/b", true},
		{"hash/two levels", "a/#", "a/b/c", true},
		{"hash/not a prefix of a level", "a/#", "ab", false},
		{"hash/not other root", "a/#", "b/a", false},
		{"hash/after plus zero levels", "+/#", "a", true},
		{"hash/after plus many levels", "+/#", "a/b/c", true},
		{"hash/alone", "#", "a", true},
		{"hash/alone deep", "#", "a/b/c", true},
		{"hash/alone slash", "#", "/", true},
		{"hash/two deep parent missing", "a/b/#", "a", false},
		{"hash/two deep parent", "a/b/#", "a/b", true},
		{"hash/two deep other", "a/b/#", "a/c/d", false},
		// Empty levels are levels.
		{"empty/plus in middle", "a/+/b", "a//b", true},
		{"empty/exact", "a//b", "a//b", true},
		{"empty/exact not without", "a//b", "a/b", false},
		{"empty/not added", "a/b", "a//b", false},
		{"empty/leading plus", "+/a", "/a", true},
		{"empty/leading trailing plus", "/+", "/a", true},
		{"empty/leading hash", "#", "/a", true},
		{"empty/leading slash hash", "/#", "/a", true},
		{"empty/leading exact", "/a", "/a", true},
		{"empty/leading plus not two levels", "+", "/a", false},
		{"empty/leading not dropped", "a", "/a", false},
		{"empty/trailing plus", "a/+", "a/", true},
		{"empty/trailing hash", "a/#", "a/", true},
		{"empty/trailing exact", "a/", "a/", true},
		{"empty/trailing not dropped", "a", "a/", false},
		{"empty/trailing not added", "a/", "a", false},
		{"empty/slash exact", "/", "/", true},
		{"empty/slash plus plus", "+/+", "/", true},
		{"empty/slash plus", "+", "/", false},
		{"empty/slash hash", "/#", "/", true},
		{"empty/double slash not slash", "//", "/", false},
		{"empty/three plus", "+/+/+", "//", true},
		// '$' topics and leading wildcards [MQTT-4.7.2-1].
		{"dollar/hash", "#", "$SYS/broker", false},
		{"dollar/hash one level", "#", "$SYS", false},
		{"dollar/plus", "+/broker", "$SYS/broker", false},
		{"dollar/plus alone", "+", "$SYS", false},
		{"dollar/plus hash", "+/#", "$SYS/x", false},
		{"dollar/dollar dollar", "#", "$", false},
		{"dollar/SYS hash", "$SYS/#", "$SYS/broker", true},
		{"dollar/SYS hash parent", "$SYS/#", "$SYS", true},
		{"dollar/SYS hash deep", "$SYS/#", "$SYS/a/b/c", true},
		{"dollar/SYS plus x", "$SYS/+/x", "$SYS/a/x", true},
		{"dollar/SYS plus x wrong", "$SYS/+/x", "$SYS/a/y", false},
		{"dollar/SYS plus", "$SYS/+", "$SYS/a", true},
		{"dollar/exact", "$SYS/broker", "$SYS/broker", true},
		{"dollar/other prefix", "$SYS/#", "$SYSX/a", false},
		{"dollar/only first level counts hash", "a/#", "a/$x", true},
		{"dollar/only first level counts plus", "a/+", "a/$x", true},
		{"dollar/later level", "+/$x", "a/$x", true},
		{"dollar/inside level", "#", "a$/b", true},
		{"dollar/single", "$", "$", true},
		// Plain levels.
		{"exact/same", "a/b", "a/b", true},
		{"exact/level prefix", "a/b", "a/bc", false},
		{"exact/level longer", "a/bc", "a/b", false},
		{"exact/no split", "ab", "a", false},
		{"exact/case", "A/b", "a/b", false},
		{"exact/utf8", "温度/センサー", "温度/センサー", true},
		{"exact/utf8 plus", "温度/+", "温度/センサー", true},
		{"exact/utf8 other", "温度/センサー", "温度/センサ", false},
		{"exact/space", "a b/c", "a b/c", true},
		// Deeper than the 8 levels a per-level hash can hold.
		{"deep/9 exact", deep9, deep9, true},
		{"deep/9 last level differs", deep9, levels(9, map[int]string{8: "x"}), false},
		{"deep/equal first 8 differ at 10", levels(10, map[int]string{8: "x", 9: "y"}), levels(10, map[int]string{8: "x", 9: "z"}), false},
		{"deep/equal first 8 same at 10", levels(10, map[int]string{8: "x", 9: "y"}), levels(10, map[int]string{8: "x", 9: "y"}), true},
		{"deep/9 vs 10 levels", deep9, levels(10, nil), false},
		{"deep/10 vs 9 levels", levels(10, nil), deep9, false},
		{"deep/short filter deep topic", "l0/l1", deep9, false},
		{"deep/nine plus", strings.Repeat("+/", 8) + "+", deep9, true},
		{"deep/nine plus vs 8", strings.Repeat("+/", 8) + "+", levels(8, nil), false},
		{"deep/nine plus vs 10", strings.Repeat("+/", 8) + "+", levels(10, nil), false},
		{"deep/40 exact", deep40, deep40, true},
		{"deep/40 differs at 39", deep40, levels(40, map[int]string{39: "x"}), false},
		{"deep/40 differs at 33", deep40, levels(40, map[int]string{33: "x"}), false},
		{"deep/40 plus near end", levels(40, map[int]string{38: "+"}), levels(40, map[int]string{38: "anything"}), true},
		{"deep/40 plus near end wrong tail", levels(40, map[int]string{38: "+"}), levels(40, map[int]string{38: "anything", 39: "x"}), false},
		{"deep/70 exact", deep70, deep70, true},
		{"deep/70 differs at 65", deep70, levels(70, map[int]string{65: "x"}), false},
		{"deep/70 plus near end", levels(70, map[int]string{68: "+"}), levels(70, map[int]string{68: "q"}), true},
		{"deep/70 plus vs 69 levels", levels(70, map[int]string{68: "+"}), levels(69, nil), false},
		{"deep/70 plus vs 71 levels", levels(70, map[int]string{68: "+"}), levels(71, nil), false},
		{"deep/hash after 10 levels parent", levels(10, nil) + "/#", levels(10, nil), true},
		{"deep/hash after 10 levels 11", levels(10, nil) + "/#", levels(11, nil), true},
		{"deep/hash after 10 levels 70", levels(10, nil) + "/#", deep70, true},
		{"deep/hash after 10 levels 9", levels(10, nil) + "/#", deep9, false},
		{"deep/hash after 10 levels differs at 9", levels(10, nil) + "/#", levels(12, map[int]string{9: "x"}), false},
		{"deep/1000 exact", deep1000, deep1000, true},
		{"deep/1000 differs at 999", deep1000, levels(1000, map[int]string{999: "x"}), false},
		{"deep/1000 plus hash", levels(998, map[int]string{500: "+"}) + "/#", deep1000, true},
		// Levels whose simple checksums collide must still be told apart.
		{"collide/permutation", "x/ab/y", "x/ba/y", false},
		{"collide/permutation 3", "abc", "cab", false},
		{"collide/permutation every level", "ab/cd", "ba/dc", false},
		{"collide/equal byte sum", "ad", "bc", false},
		{"collide/equal byte sum mod 256", "a", "uvv", false},
		{"collide/equal xor", "a", "axx", false},
		{"collide/xor zero vs empty level", "a//b", "a/aa/b", false},
		{"collide/sum zero vs empty level", "a//b", "a/UUV/b", false},
		{"collide/sum zero vs absent level", "a/UUV", "a", false},
		{"collide/sum zero vs empty trailing", "a/UUV", "a/", false},
		{"collide/xor zero vs absent level", "a/aa", "a", false},
		{"collide/empty vs absent", "a/", "a", false},
		{"collide/deep permutation", levels(9, map[int]string{8: "ab"}), levels(9, map[int]string{8: "ba"}), false},
		{"collide/deep permutation before 8", levels(9, map[int]string{3: "ab"}), levels(9, map[int]string{3: "ba"}), false},
		{"collide/plus mask absent level", "a/+", "a", false},
		{"collide/plus then permutation", "+/ab", "x/ba", false},
	}
}

// TestMatchSemantics checks each case with Matches, with the oracle, and with
// an index holding the filter alone, plain and shared.
func TestMatchSemantics(t *testing.T) {
	for _, c := range matchCases() {
		t.Run(c.name, func(t *testing.T) {
			if err := ValidateFilter(c.filter); err != nil {
				t.Fatalf("ValidateFilter(%q): %v", c.filter, err)
			}
			if err := ValidateTopic(c.topic); err != nil {
				t.Fatalf("ValidateTopic(%q): %v", c.topic, err)
			}
			if got := oracleMatches(c.filter, c.topic); got != c.want {
				t.Fatalf("oracleMatches(%q, %q) = %v, want %v (fix the oracle)", c.filter, c.topic, got, c.want)
			}
			if got := Matches(c.filter, c.topic); got != c.want {
				t.Errorf("Matches(%q, %q) = %v, want %v", c.filter, c.topic, got, c.want)
			}

			x, o := build(t, subSpec{7, c.filter, 1, 42})
			r := expectMatch(t, x, o, c.topic, NoHandle)
			if got := len(r.Deliveries) == 1; got != c.want {
				t.Errorf("index with %q: topic %q delivered %+v, want match=%v", c.filter, c.topic, r.Deliveries, c.want)
			}

			x, o = build(t, subSpec{7, "$share/g/" + c.filter, 2, 43}, subSpec{8, "$share/g/" + c.filter, 2, 44})
			r = expectMatch(t, x, o, c.topic, NoHandle)
			if got := len(r.Deliveries) == 1 && r.Deliveries[0].Shared; got != c.want {
				t.Errorf("index with shared %q: topic %q delivered %+v, want match=%v", c.filter, c.topic, r.Deliveries, c.want)
			}
		})
	}
}

// TestManyFiltersOneIndex puts every filter of the semantic cases into one
// index, each under its own session, and checks every topic against the oracle.
func TestManyFiltersOneIndex(t *testing.T) {
	cases := matchCases()
	x, o := NewIndex(), newOracle()
	byFilter := map[string]Handle{}
	for _, c := range cases {
		if _, ok := byFilter[c.filter]; ok {
			continue
		}
		h := Handle(len(byFilter) + 1)
		byFilter[c.filter] = h
		if _, err := x.Subscribe(h, c.filter, Options(h%3), uint32(h)); err != nil {
			t.Fatalf("Subscribe(%q): %v", c.filter, err)
		}
		o.subscribe(h, c.filter, Options(h%3), uint32(h))
	}
	for _, c := range cases {
		r := expectMatch(t, x, o, c.topic, NoHandle)
		normal, _ := split(t, r)
		if _, got := normal[byFilter[c.filter]]; got != c.want {
			t.Errorf("filter %q, topic %q: delivered=%v, want %v", c.filter, c.topic, got, c.want)
		}
	}
}

// TestCollidingFiltersCoexist subscribes filters whose levels have equal
// checksums under several simple schemes; each topic must reach only its own.
func TestCollidingFiltersCoexist(t *testing.T) {
	groups := [][]string{
		{"x/ab/y", "x/ba/y"},
		{"ad", "bc", "da", "cb"},
		{"a", "uvv", "axx", "vuv"},
		{"a//b", "a/aa/b", "a/UUV/b", "a/bb/b"},
		{"q", "q/", "q/aa", "q/UUV"},
		{levels(9, map[int]string{8: "ab"}), levels(9, map[int]string{8: "ba"})},
		{levels(12, map[int]string{10: "ab"}), levels(12, map[int]string{10: "ba"}), levels(12, nil)},
	}
	for _, g := range groups {
		var specs []subSpec
		for i, f := range g {
			specs = append(specs, subSpec{Handle(i + 1), f, 0, 0})
		}
		x, o := build(t, specs...)
		for i, topic := range g {
			r := expectMatch(t, x, o, topic, NoHandle)
			if got := handles(r, false); !slices.Equal(got, []Handle{Handle(i + 1)}) {
				t.Errorf("topic %q among %q: delivered %v, want only %d", topic, g, got, i+1)
			}
		}
	}
}

func TestMatchEmptyIndex(t *testing.T) {
	x := NewIndex()
	var r Result
	for _, topic := range []string{"a", "a/b", "/", "$SYS/x", levels(20, nil)} {
		x.Match(topic, NoHandle, &r)
		if len(r.Deliveries) != 0 {
			t.Errorf("empty index: Match(%q) = %+v", topic, r.Deliveries)
		}
	}
	if x.Len() != 0 || x.Filters() != 0 {
		t.Errorf("empty index: Len %d Filters %d", x.Len(), x.Filters())
	}
}

// TestResultReset checks that Match resets r rather than appending.
func TestResultReset(t *testing.T) {
	x, _ := build(t, subSpec{1, "a/#", 0, 0}, subSpec{2, "a/b", 0, 0}, subSpec{3, "+/b", 0, 0})
	var r Result
	x.Match("a/b", NoHandle, &r)
	if len(r.Deliveries) != 3 {
		t.Fatalf("a/b: %+v, want 3 deliveries", r.Deliveries)
	}
	x.Match("a/c", NoHandle, &r)
	if got := handles(&r, false); !slices.Equal(got, []Handle{1}) || len(r.Deliveries) != 1 {
		t.Errorf("a/c after a/b: %+v, want only session 1", r.Deliveries)
	}
	x.Match("z", NoHandle, &r)
	if len(r.Deliveries) != 0 {
		t.Errorf("z: %+v, want none", r.Deliveries)
	}
}

func TestUnsubscribeOneOfSeveral(t *testing.T) {
	x, o := build(t,
		subSpec{1, "a/b", 1, 0}, subSpec{2, "a/b", 1, 0}, subSpec{3, "a/b", 1, 0},
		subSpec{1, "a/+", 0, 0}, subSpec{4, "a/+", 0, 0})
	if !x.Unsubscribe(2, "a/b") {
		t.Fatal("Unsubscribe(2, a/b) = false, want true")
	}
	o.unsubscribe(2, "a/b")
	r := expectMatch(t, x, o, "a/b", NoHandle)
	if got := handles(r, false); !slices.Equal(got, []Handle{1, 3, 4}) {
		t.Errorf("after unsubscribing 2: %v, want [1 3 4]", got)
	}
	if x.Unsubscribe(2, "a/b") {
		t.Error("second Unsubscribe(2, a/b) = true, want false")
	}
	if x.Unsubscribe(5, "a/b") {
		t.Error("Unsubscribe of a session never subscribed = true")
	}
	if x.Unsubscribe(1, "a/c") {
		t.Error("Unsubscribe of a filter never subscribed = true")
	}
	if x.Unsubscribe(1, "a/#") || x.Unsubscribe(1, "+/b") {
		t.Error("Unsubscribe must take the exact filter, not one that matches")
	}
	if x.Unsubscribe(1, "a/+/") || x.Unsubscribe(1, "a+") || x.Unsubscribe(1, "") {
		t.Error("Unsubscribe of an invalid or absent filter = true")
	}
	// Session 1 keeps a/+ after losing a/b.
	if !x.Unsubscribe(1, "a/b") {
		t.Fatal("Unsubscribe(1, a/b) = false")
	}
	o.unsubscribe(1, "a/b")
	r = expectMatch(t, x, o, "a/b", NoHandle)
	if got := handles(r, false); !slices.Equal(got, []Handle{1, 3, 4}) {
		t.Errorf("after unsubscribing 1 from a/b: %v, want [1 3 4] (1 still has a/+)", got)
	}
	n, _ := split(t, r)
	if i, ok := n[1]; ok && r.Deliveries[i].Opts.QoS() != 0 {
		t.Errorf("session 1 QoS %d, want 0 from a/+ only", r.Deliveries[i].Opts.QoS())
	}
	for _, s := range []struct {
		h Handle
		f string
	}{{3, "a/b"}, {1, "a/+"}, {4, "a/+"}} {
		if !x.Unsubscribe(s.h, s.f) {
			t.Fatalf("Unsubscribe(%d, %q) = false", s.h, s.f)
		}
		o.unsubscribe(s.h, s.f)
	}
	r = expectMatch(t, x, o, "a/b", NoHandle)
	if len(r.Deliveries) != 0 {
		t.Errorf("after unsubscribing all: %+v", r.Deliveries)
	}
	if x.Len() != 0 || x.Filters() != 0 {
		t.Errorf("after unsubscribing all: Len %d Filters %d, want 0 0", x.Len(), x.Filters())
	}
}

func TestResubscribeReplaces(t *testing.T) {
	x, o := build(t, subSpec{1, "a/+", 0, 5}, subSpec{2, "a/+", 1, 6})
	replaced, err := x.Subscribe(1, "a/+", 2, 7)
	if err != nil || !replaced {
		t.Fatalf("resubscribe: replaced=%v err=%v, want true nil", replaced, err)
	}
	o.subscribe(1, "a/+", 2, 7)
	if x.Len() != 2 || x.Filters() != 1 {
		t.Errorf("after resubscribe: Len %d Filters %d, want 2 1", x.Len(), x.Filters())
	}
	r := expectMatch(t, x, o, "a/b", NoHandle)
	n, _ := split(t, r)
	if len(r.Deliveries) != 2 {
		t.Fatalf("deliveries %+v, want 2", r.Deliveries)
	}
	d := r.Deliveries[n[1]]
	if d.Opts.QoS() != 2 || d.ID != 7 || !slices.Equal(r.IDs(n[1], nil), []uint32{7}) {
		t.Errorf("session 1 after resubscribe: %+v ids %v, want QoS 2 id 7", d, r.IDs(n[1], nil))
	}
	// Lowering QoS and dropping the identifier also replaces.
	if replaced, _ := x.Subscribe(1, "a/+", 0, 0); !replaced {
		t.Error("second resubscribe: replaced=false")
	}
	o.subscribe(1, "a/+", 0, 0)
	r = expectMatch(t, x, o, "a/b", NoHandle)
	n, _ = split(t, r)
	d = r.Deliveries[n[1]]
	if d.Opts.QoS() != 0 || d.ID != 0 || len(r.IDs(n[1], nil)) != 0 {
		t.Errorf("session 1 after downgrade: %+v ids %v, want QoS 0 no id", d, r.IDs(n[1], nil))
	}
	// NoLocal can be switched on by resubscribing.
	x.Subscribe(1, "a/+", NoLocal|1, 9)
	o.subscribe(1, "a/+", NoLocal|1, 9)
	r = expectMatch(t, x, o, "a/b", 1)
	if got := handles(r, false); !slices.Equal(got, []Handle{2}) {
		t.Errorf("after resubscribe with NoLocal, publisher 1: %v, want [2]", got)
	}
	// A shared subscription is a different subscription from the plain one,
	// and each share group is its own.
	if replaced, _ := x.Subscribe(1, "$share/g/a/+", 1, 0); replaced {
		t.Error("first shared subscribe reported replaced")
	}
	if replaced, _ := x.Subscribe(1, "$share/h/a/+", 1, 0); replaced {
		t.Error("subscribe to another group reported replaced")
	}
	if replaced, _ := x.Subscribe(1, "$share/g/a/+", 2, 3); !replaced {
		t.Error("shared resubscribe: replaced=false")
	}
	if x.Len() != 4 {
		t.Errorf("Len %d, want 4", x.Len())
	}
	o.subscribe(1, "$share/g/a/+", 2, 3)
	o.subscribe(1, "$share/h/a/+", 1, 0)
	expectMatch(t, x, o, "a/b", NoHandle)
}

func TestOverlapOneDelivery(t *testing.T) {
	x, o := build(t,
		subSpec{1, "a/b/c", 0, 11},
		subSpec{1, "a/+/c", 2, 12},
		subSpec{1, "a/#", 1, 0},
		subSpec{1, "#", 0, 14},
		subSpec{1, "+/+/+", 1, 15},
		subSpec{2, "a/#", 0, 21})
	r := expectMatch(t, x, o, "a/b/c", NoHandle)
	n, shared := split(t, r)
	if len(r.Deliveries) != 2 || len(shared) != 0 {
		t.Fatalf("deliveries %+v, want one per session", r.Deliveries)
	}
	i := n[1]
	d := r.Deliveries[i]
	if d.Opts.QoS() != 2 {
		t.Errorf("merged QoS %d, want 2", d.Opts.QoS())
	}
	want := []uint32{11, 12, 14, 15}
	ids := r.IDs(i, nil)
	slices.Sort(ids)
	if !slices.Equal(ids, want) {
		t.Errorf("IDs = %v, want %v", ids, want)
	}
	if !slices.Contains(want, d.ID) {
		t.Errorf("ID = %d, want one of %v", d.ID, want)
	}
	// IDs appends to dst.
	got := r.IDs(i, []uint32{99})
	if len(got) != 5 || got[0] != 99 {
		t.Errorf("IDs with dst [99] = %v, want 99 followed by 4 ids", got)
	}
	if got := r.IDs(n[2], nil); !slices.Equal(got, []uint32{21}) {
		t.Errorf("session 2 IDs = %v, want [21]", got)
	}
	// Only some of the filters match a/x/d.
	r = expectMatch(t, x, o, "a/x/d", NoHandle)
	n, _ = split(t, r)
	if d := r.Deliveries[n[1]]; d.Opts.QoS() != 1 {
		t.Errorf("a/x/d: QoS %d, want 1", d.Opts.QoS())
	}
	ids = r.IDs(n[1], nil)
	slices.Sort(ids)
	if !slices.Equal(ids, []uint32{14, 15}) {
		t.Errorf("a/x/d: IDs = %v, want [14 15]", ids)
	}
}

func TestNoLocal(t *testing.T) {
	x, o := build(t,
		subSpec{1, "a/b", NoLocal | 2, 1},
		subSpec{2, "a/b", NoLocal | 1, 2},
		subSpec{3, "a/+", 0, 3})
	for _, pub := range []Handle{NoHandle, 1, 2, 3, 4} {
		r := expectMatch(t, x, o, "a/b", pub)
		for _, d := range r.Deliveries {
			if d.Handle == pub && d.Handle != 3 {
				t.Errorf("publisher %d received its own message: %+v", pub, d)
			}
		}
		if want := 3 - btoi(pub == 1 || pub == 2); len(r.Deliveries) != want {
			t.Errorf("publisher %d: %d deliveries, want %d", pub, len(r.Deliveries), want)
		}
	}
	// A NoLocal subscription is skipped but an overlapping one without
	// NoLocal still delivers, with only its own QoS and identifier.
	x.Subscribe(1, "a/#", 0, 9)
	o.subscribe(1, "a/#", 0, 9)
	r := expectMatch(t, x, o, "a/b", 1)
	n, _ := split(t, r)
	i, ok := n[1]
	if !ok {
		t.Fatalf("publisher 1 with a/# without NoLocal: not delivered: %+v", r.Deliveries)
	}
	if r.Deliveries[i].Opts.QoS() != 0 || !slices.Equal(r.IDs(i, nil), []uint32{9}) {
		t.Errorf("publisher 1: %+v ids %v, want QoS 0 ids [9]", r.Deliveries[i], r.IDs(i, nil))
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// sharedPicks runs Match n times and returns the session picked each time for
// a topic matched by exactly one shared group.
func sharedPicks(t *testing.T, x *Index, topics []string, n int, members []Handle) []Handle {
	t.Helper()
	var picks []Handle
	var r Result
	for i := range n {
		topic := topics[i%len(topics)]
		x.Match(topic, NoHandle, &r)
		if len(r.Deliveries) != 1 || !r.Deliveries[0].Shared {
			t.Fatalf("Match(%q) #%d: %+v, want exactly one shared delivery", topic, i, r.Deliveries)
		}
		h := r.Deliveries[0].Handle
		if !slices.Contains(members, h) {
			t.Fatalf("Match(%q) #%d picked %d, not a member of %v", topic, i, h, members)
		}
		picks = append(picks, h)
	}
	return picks
}

func TestSharedRoundRobin(t *testing.T) {
	members := []Handle{3, 5, 9}
	x, _ := build(t,
		subSpec{3, "$share/g/a/+", 1, 0},
		subSpec{5, "$share/g/a/+", 1, 0},
		subSpec{9, "$share/g/a/+", 1, 0})
	for _, topics := range [][]string{{"a/b"}, {"a/x", "a/y"}} {
		picks := sharedPicks(t, x, topics, 12, members)
		// Round robin: every window of len(members) successive picks holds
		// each member once.
		for i := 0; i+len(members) <= len(picks); i++ {
			w := slices.Clone(picks[i : i+len(members)])
			slices.Sort(w)
			if !slices.Equal(w, members) {
				t.Fatalf("topics %v: picks %v are not round robin over %v (window at %d)", topics, picks, members, i)
			}
		}
	}
	// A new member joins the rotation; a departed one leaves it.
	x.Subscribe(11, "$share/g/a/+", 1, 0)
	x.Unsubscribe(5, "$share/g/a/+")
	members = []Handle{3, 9, 11}
	picks := sharedPicks(t, x, []string{"a/b"}, 9, members)
	for _, m := range members {
		if c := count(picks, m); c == 0 {
			t.Errorf("after membership change: %d never picked in %v", m, picks)
		}
	}
	if count(picks, 5) != 0 {
		t.Errorf("unsubscribed member 5 picked: %v", picks)
	}
}

func count(hs []Handle, h Handle) int {
	n := 0
	for _, x := range hs {
		if x == h {
			n++
		}
	}
	return n
}

func TestSharedSkipsOffline(t *testing.T) {
	members := []Handle{1, 2, 3}
	x, _ := build(t,
		subSpec{1, "$share/g/t", 0, 0},
		subSpec{2, "$share/g/t", 0, 0},
		subSpec{3, "$share/g/t", 0, 0})
	x.SetOnline(2, false)
	picks := sharedPicks(t, x, []string{"t"}, 8, members)
	if count(picks, 2) != 0 {
		t.Errorf("offline member 2 picked: %v", picks)
	}
	if count(picks, 1) == 0 || count(picks, 3) == 0 {
		t.Errorf("online members not both picked: %v", picks)
	}
	x.SetOnline(2, true)
	picks = sharedPicks(t, x, []string{"t"}, 6, members)
	for _, m := range members {
		if count(picks, m) == 0 {
			t.Errorf("after 2 came back online: %d never picked in %v", m, picks)
		}
	}
	// Offline state belongs to the session, set before it subscribes.
	x.SetOnline(4, false)
	x.Subscribe(4, "$share/h/u", 0, 0)
	x.Subscribe(5, "$share/h/u", 0, 0)
	picks = sharedPicks(t, x, []string{"u"}, 6, []Handle{4, 5})
	if count(picks, 4) != 0 {
		t.Errorf("session 4 marked offline before subscribing was picked: %v", picks)
	}
	// Marking sessions that have no subscriptions is harmless.
	x.SetOnline(1000, false)
	x.SetOnline(1000, true)
}

func TestSharedAllOffline(t *testing.T) {
	members := []Handle{1, 2, 3}
	x, _ := build(t,
		subSpec{1, "$share/g/t/#", 0, 0},
		subSpec{2, "$share/g/t/#", 0, 0},
		subSpec{3, "$share/g/t/#", 0, 0})
	for _, m := range members {
		x.SetOnline(m, false)
	}
	// sharedPicks asserts exactly one delivery from a member each time.
	sharedPicks(t, x, []string{"t", "t/a"}, 6, members)
	x.SetOnline(3, true)
	picks := sharedPicks(t, x, []string{"t/a"}, 6, members)
	if count(picks, 3) != 6 {
		t.Errorf("only 3 is online, picks %v", picks)
	}
}

func TestSharedGroups(t *testing.T) {
	x, o := build(t,
		subSpec{1, "$share/g1/a/b", 1, 1},
		subSpec{2, "$share/g1/a/b", 1, 2},
		subSpec{3, "$share/g2/a/b", 2, 3},
		subSpec{4, "$share/g2/a/b", 2, 4},
		// Same group name, different filter: a different shared subscription.
		subSpec{5, "$share/g1/a/+", 0, 5},
	)
	for range 4 {
		r := expectMatch(t, x, o, "a/b", NoHandle)
		_, shared := split(t, r)
		if len(shared) != 3 || len(r.Deliveries) != 3 {
			t.Fatalf("a/b: %+v, want three shared deliveries (g1 a/b, g2 a/b, g1 a/+)", r.Deliveries)
		}
		hs := handles(r, true)
		if hs[2] != 5 || hs[0] != 1 && hs[0] != 2 || hs[1] != 3 && hs[1] != 4 {
			t.Errorf("a/b: picks %v, want one of {1,2}, one of {3,4}, and 5", hs)
		}
	}
	r := expectMatch(t, x, o, "a/c", NoHandle)
	if hs := handles(r, true); !slices.Equal(hs, []Handle{5}) || len(r.Deliveries) != 1 {
		t.Errorf("a/c: %+v, want only 5", r.Deliveries)
	}
}

func TestSharedAndNonSharedSeparate(t *testing.T) {
	x, o := build(t,
		subSpec{1, "a/b", 1, 10},
		subSpec{1, "$share/g/a/b", 2, 20},
		subSpec{1, "a/#", 0, 30})
	r := expectMatch(t, x, o, "a/b", NoHandle)
	if len(r.Deliveries) != 2 {
		t.Fatalf("deliveries %+v, want a plain and a shared one for session 1", r.Deliveries)
	}
	n, shared := split(t, r)
	if len(shared) != 1 {
		t.Fatalf("shared deliveries %d, want 1", len(shared))
	}
	p, s := r.Deliveries[n[1]], r.Deliveries[shared[0]]
	if s.Handle != 1 || s.Opts.QoS() != 2 || s.ID != 20 || !slices.Equal(r.IDs(shared[0], nil), []uint32{20}) {
		t.Errorf("shared delivery %+v ids %v, want session 1 QoS 2 id 20", s, r.IDs(shared[0], nil))
	}
	ids := r.IDs(n[1], nil)
	slices.Sort(ids)
	if p.Opts.QoS() != 1 || !slices.Equal(ids, []uint32{10, 30}) {
		t.Errorf("plain delivery %+v ids %v, want QoS 1 ids [10 30] (shared QoS/id must not leak in)", p, ids)
	}
}

func TestSharedUnsubscribe(t *testing.T) {
	x, o := build(t, subSpec{1, "$share/g/a", 0, 0}, subSpec{2, "$share/g/a", 0, 0}, subSpec{3, "a", 0, 0})
	if x.Unsubscribe(1, "a") {
		t.Error("Unsubscribe(1, a) removed a shared subscription")
	}
	if x.Unsubscribe(1, "$share/h/a") {
		t.Error("Unsubscribe from another group = true")
	}
	if !x.Unsubscribe(1, "$share/g/a") {
		t.Fatal("Unsubscribe(1, $share/g/a) = false")
	}
	o.unsubscribe(1, "$share/g/a")
	for range 4 {
		r := expectMatch(t, x, o, "a", NoHandle)
		if hs := handles(r, true); !slices.Equal(hs, []Handle{2}) {
			t.Errorf("shared picks %v, want [2]", hs)
		}
	}
	x.Unsubscribe(2, "$share/g/a")
	o.unsubscribe(2, "$share/g/a")
	r := expectMatch(t, x, o, "a", NoHandle)
	if len(r.Deliveries) != 1 || r.Deliveries[0].Shared || r.Deliveries[0].Handle != 3 {
		t.Errorf("after the group emptied: %+v, want only 3", r.Deliveries)
	}
	if x.Len() != 1 {
		t.Errorf("Len %d, want 1", x.Len())
	}
}

func TestLenFilters(t *testing.T) {
	x := NewIndex()
	step := func(what string, subs, filters int) {
		t.Helper()
		if x.Len() != subs || x.Filters() != filters {
			t.Errorf("%s: Len %d Filters %d, want %d %d", what, x.Len(), x.Filters(), subs, filters)
		}
	}
	sub := func(h Handle, f string, wantReplaced bool) {
		t.Helper()
		replaced, err := x.Subscribe(h, f, 0, 0)
		if err != nil || replaced != wantReplaced {
			t.Fatalf("Subscribe(%d, %q) = %v, %v, want %v, nil", h, f, replaced, err, wantReplaced)
		}
	}
	sub(1, "a/b", false)
	step("1 a/b", 1, 1)
	sub(2, "a/b", false)
	step("2 a/b", 2, 1)
	sub(1, "a/+", false)
	step("1 a/+", 3, 2)
	sub(1, "a/b", true)
	step("1 a/b again", 3, 2)
	sub(3, "#", false)
	sub(3, levels(12, nil), false)
	step("3 # and deep", 5, 4)
	x.Unsubscribe(1, "a/b")
	step("unsub 1 a/b", 4, 4)
	x.Unsubscribe(2, "a/b")
	step("unsub 2 a/b", 3, 3)
	x.Unsubscribe(2, "a/b")
	step("unsub 2 a/b twice", 3, 3)
	x.Unsubscribe(1, "a/+")
	x.Unsubscribe(3, "#")
	x.Unsubscribe(3, levels(12, nil))
	step("all gone", 0, 0)
	sub(1, "a/b", false)
	step("a/b again after all gone", 1, 1)
	// Shared subscriptions count as subscriptions.
	sub(1, "$share/g/a/b", false)
	sub(2, "$share/g/a/b", false)
	if x.Len() != 3 {
		t.Errorf("with shared: Len %d, want 3", x.Len())
	}
	if f := x.Filters(); f < 1 || f > 2 {
		t.Errorf("with shared: Filters %d, want 1 or 2 (a/b and $share/g/a/b)", f)
	}
}

func TestSubscribeInvalid(t *testing.T) {
	cases := []struct {
		filter string
		want   error
	}{
		{"", ErrEmpty},
		{"a+", ErrPlusNotAlone},
		{"a/+b", ErrPlusNotAlone},
		{"a/#/b", ErrHashNotLast},
		{"a/b#", ErrHashNotAlone},
		{"a\x00b", ErrNUL},
		{"\xff", ErrUTF8},
		{strings.Repeat("a", 65536), ErrTooLong},
		{"$share//a", ErrShareGroup},
		{"$share/g+/a", ErrShareGroup},
		{"$share/g/", ErrShareFilter},
		{"$share/g/a+", ErrPlusNotAlone},
	}
	x := NewIndex()
	x.Subscribe(1, "ok", 0, 0)
	for _, c := range cases {
		replaced, err := x.Subscribe(1, c.filter, 1, 1)
		if !errors.Is(err, c.want) {
			t.Errorf("Subscribe(%.20q) error %v, want %v", c.filter, err, c.want)
		}
		if replaced {
			t.Errorf("Subscribe(%.20q) replaced=true with an error", c.filter)
		}
	}
	if x.Len() != 1 || x.Filters() != 1 {
		t.Errorf("invalid subscribes changed the index: Len %d Filters %d", x.Len(), x.Filters())
	}
	var r Result
	x.Match("ok", NoHandle, &r)
	if len(r.Deliveries) != 1 {
		t.Errorf("Match(ok) = %+v", r.Deliveries)
	}
}

func TestOptions(t *testing.T) {
	cases := []struct {
		o      Options
		qos    byte
		rh     byte
		noLoc  bool
		retain bool
	}{
		{0x00, 0, 0, false, false},
		{0x01, 1, 0, false, false},
		{0x02, 2, 0, false, false},
		{0x06, 2, 0, true, false},
		{0x09, 1, 0, false, true},
		{0x15, 1, 1, true, false},
		{0x2e, 2, 2, true, true},
	}
	for _, c := range cases {
		if c.o.QoS() != c.qos || c.o.RetainHandling() != c.rh || (c.o&NoLocal != 0) != c.noLoc || (c.o&RetainAsPublished != 0) != c.retain {
			t.Errorf("Options(%#x): QoS %d RH %d, want %d %d", uint8(c.o), c.o.QoS(), c.o.RetainHandling(), c.qos, c.rh)
		}
	}
	if QoSMask != 0x03 || NoLocal != 0x04 || RetainAsPublished != 0x08 || RetainHandlingMask != 0x30 {
		t.Error("option bits differ from the MQTT v5 wire layout")
	}
}

// TestMatchAllocs checks that Match allocates nothing once r has grown.
func TestMatchAllocs(t *testing.T) {
	x, _ := build(t,
		subSpec{1, "a/b/c", 1, 1}, subSpec{2, "a/b/c", 1, 0}, subSpec{3, "a/b/c", 0, 3},
		subSpec{4, "a/+/c", 1, 4}, subSpec{5, "a/#", 2, 5}, subSpec{6, "#", 0, 0}, subSpec{7, "+/+/+", 0, 7},
		subSpec{8, "o/p", 0, 81}, subSpec{8, "o/+", 1, 82}, subSpec{8, "o/#", 2, 83}, subSpec{8, "#", 0, 84},
		subSpec{9, "$share/g/s/t", 1, 91}, subSpec{10, "$share/g/s/t", 1, 92}, subSpec{11, "$share/g/s/t", 1, 93},
		subSpec{12, "$share/h/s/+", 0, 0}, subSpec{13, "s/t", 0, 0},
		subSpec{14, levels(12, map[int]string{10: "+"}), 0, 14}, subSpec{15, levels(5, nil) + "/#", 0, 15},
	)
	x.SetOnline(10, false)
	for _, c := range []struct{ name, topic string }{
		{"exact", "a/b/c"},
		{"wildcard", "a/x/c"},
		{"overlap", "o/p"},
		{"shared", "s/t"},
		{"deep", levels(12, map[int]string{10: "zz"})},
		{"none", "$none/x"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var r Result
			ids := make([]uint32, 0, 16)
			for range 8 {
				x.Match(c.topic, NoHandle, &r)
			}
			if len(r.Deliveries) == 0 && c.name != "none" {
				t.Fatalf("Match(%q) delivered nothing", c.topic)
			}
			allocs := testing.AllocsPerRun(200, func() {
				x.Match(c.topic, 8, &r)
				for i := range r.Deliveries {
					ids = r.IDs(i, ids[:0])
				}
			})
			if allocs != 0 {
				t.Errorf("Match(%q) allocates %.1f times per call in steady state, want 0", c.topic, allocs)
			}
		})
	}
}

// TestSubscribeRejects covers the requests the index refuses besides bad
// filters: No Local on a shared subscription is a protocol error
// [MQTT-3.8.3-4], and NoHandle names no session.
func TestSubscribeRejects(t *testing.T) {
	x := NewIndex()
	if _, err := x.Subscribe(1, "$share/g/a", NoLocal|1, 0); !errors.Is(err, ErrShareNoLocal) {
		t.Errorf("shared subscription with NoLocal: err %v, want %v", err, ErrShareNoLocal)
	}
	if _, err := x.Subscribe(NoHandle, "a", 0, 0); !errors.Is(err, ErrNoHandle) {
		t.Errorf("Subscribe(NoHandle): err %v, want %v", err, ErrNoHandle)
	}
	if x.Len() != 0 || x.Filters() != 0 {
		t.Errorf("refused subscriptions changed the index: Len %d Filters %d", x.Len(), x.Filters())
	}
}
