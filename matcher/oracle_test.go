package matcher

// The reference model the index is checked against. It is deliberately slow
// and plain: a trie with one node per filter level, plus a flat list of every
// subscription matched level by level with oracleMatches. The two halves are
// written independently so that they check each other as well as the index.

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// oracleMatches reports whether filter (non-shared, valid) matches topic
// (valid), comparing the '/'-separated levels directly.
func oracleMatches(filter, topic string) bool {
	fl := strings.Split(filter, "/")
	tl := strings.Split(topic, "/")
	// [MQTT-4.7.2-1]: a leading wildcard does not match a topic starting with '$'.
	if strings.HasPrefix(topic, "$") && (fl[0] == "+" || fl[0] == "#") {
		return false
	}
	for i, f := range fl {
		if f == "#" {
			// '#' matches the parent level and everything below it.
			return true
		}
		if i >= len(tl) {
			return false
		}
		if f != "+" && f != tl[i] {
			return false
		}
	}
	return len(fl) == len(tl)
}

// oracleSplitShared splits "$share/{group}/{inner}" written independently of
// SplitShared. It is only ever given valid filters.
func oracleSplitShared(filter string) (group, inner string, ok bool) {
	const prefix = "$share/"
	if !strings.HasPrefix(filter, prefix) {
		return "", filter, false
	}
	rest := filter[len(prefix):]
	i := strings.IndexByte(rest, '/')
	if i < 0 {
		return "", filter, false
	}
	return rest[:i], rest[i+1:], true
}

// oracleValidTopic is the specification's rule for a PUBLISH topic name.
func oracleValidTopic(topic string) bool {
	return len(topic) > 0 && len(topic) <= 65535 &&
		!strings.ContainsRune(topic, 0) && utf8.ValidString(topic) &&
		!strings.ContainsAny(topic, "+#")
}

// oracleValidFilter is the specification's rule for a SUBSCRIBE topic filter,
// including the shared form.
func oracleValidFilter(filter string) bool {
	if len(filter) == 0 || len(filter) > 65535 || strings.ContainsRune(filter, 0) || !utf8.ValidString(filter) {
		return false
	}
	inner := filter
	if strings.HasPrefix(filter, "$share/") {
		rest := filter[len("$share/"):]
		i := strings.IndexByte(rest, '/')
		if i <= 0 {
			return false // no group, or no '/' after the group
		}
		if strings.ContainsAny(rest[:i], "+#") {
			return false
		}
		inner = rest[i+1:]
		if inner == "" {
			return false
		}
	}
	levels := strings.Split(inner, "/")
	for i, l := range levels {
		if strings.Contains(l, "+") && l != "+" {
			return false
		}
		if strings.Contains(l, "#") && (l != "#" || i != len(levels)-1) {
			return false
		}
	}
	return true
}

type oracleSub struct {
	opts Options
	id   uint32
}

type oracleNode struct {
	path     string // the inner filter that ends at this node
	children map[string]*oracleNode
	plus     *oracleNode
	hash     *oracleNode
	subs     map[Handle]oracleSub
	groups   map[string]map[Handle]oracleSub // share group name -> members
}

func newOracleNode(path string) *oracleNode {
	return &oracleNode{
		path:     path,
		children: map[string]*oracleNode{},
		subs:     map[Handle]oracleSub{},
		groups:   map[string]map[Handle]oracleSub{},
	}
}

type oracleKey struct {
	h      Handle
	filter string // as given, shared prefix included
}

type oracle struct {
	root    *oracleNode
	flat    map[oracleKey]oracleSub
	offline map[Handle]bool
}

func newOracle() *oracle {
	return &oracle{root: newOracleNode(""), flat: map[oracleKey]oracleSub{}, offline: map[Handle]bool{}}
}

// node walks (and with create, builds) the trie path of a non-shared filter.
func (o *oracle) node(inner string, create bool) *oracleNode {
	n := o.root
	for i, l := range strings.Split(inner, "/") {
		var next **oracleNode
		var child *oracleNode
		switch l {
		case "+":
			next = &n.plus
		case "#":
			next = &n.hash
		default:
			child = n.children[l]
			next = &child
		}
		if *next == nil {
			if !create {
				return nil
			}
			path := l
			if i > 0 {
				path = n.path + "/" + l
			}
			*next = newOracleNode(path)
			if l != "+" && l != "#" {
				n.children[l] = *next
			}
		}
		n = *next
	}
	return n
}

func (o *oracle) subscribe(h Handle, filter string, opts Options, id uint32) (replaced bool) {
	k := oracleKey{h, filter}
	_, replaced = o.flat[k]
	s := oracleSub{opts, id}
	o.flat[k] = s
	group, inner, shared := oracleSplitShared(filter)
	n := o.node(inner, true)
	if !shared {
		n.subs[h] = s
		return replaced
	}
	if n.groups[group] == nil {
		n.groups[group] = map[Handle]oracleSub{}
	}
	n.groups[group][h] = s
	return replaced
}

func (o *oracle) unsubscribe(h Handle, filter string) bool {
	k := oracleKey{h, filter}
	if _, ok := o.flat[k]; !ok {
		return false
	}
	delete(o.flat, k)
	group, inner, shared := oracleSplitShared(filter)
	n := o.node(inner, false)
	if n == nil {
		panic("oracle: trie lost a subscription of " + filter)
	}
	if !shared {
		delete(n.subs, h)
		return true
	}
	delete(n.groups[group], h)
	if len(n.groups[group]) == 0 {
		delete(n.groups, group)
	}
	return true
}

func (o *oracle) setOnline(h Handle, online bool) {
	if online {
		delete(o.offline, h)
	} else {
		o.offline[h] = true
	}
}

func (o *oracle) len() int { return len(o.flat) }

// filterBounds gives the number of distinct filters counted two ways: by inner
// filter (shared prefix stripped) and by the full string.
func (o *oracle) filterBounds() (inner, full int) {
	in, fu := map[string]bool{}, map[string]bool{}
	for k := range o.flat {
		_, f, _ := oracleSplitShared(k.filter)
		in[f] = true
		fu[k.filter] = true
	}
	return len(in), len(fu)
}

// oracleAgg is the expected delivery of one session's non-shared subscriptions.
type oracleAgg struct {
	qos byte
	ids []uint32 // one per matching subscription with a non-zero id, sorted
}

// oracleGroup is a shared subscription (group, inner filter) that matched.
type oracleGroup struct {
	key     string // group + "\x00" + inner filter
	members map[Handle]oracleSub
}

type oracleExpect struct {
	normal map[Handle]*oracleAgg
	groups []oracleGroup // sorted by key
}

func (e *oracleExpect) add(h Handle, s oracleSub, publisher Handle) {
	if s.opts&NoLocal != 0 && h == publisher {
		return // [MQTT-3.8.3-3]
	}
	a := e.normal[h]
	if a == nil {
		a = &oracleAgg{}
		e.normal[h] = a
	}
	a.qos = max(a.qos, s.opts.QoS())
	if s.id != 0 {
		a.ids = append(a.ids, s.id)
	}
}

func (e *oracleExpect) finish() {
	for _, a := range e.normal {
		slices.Sort(a.ids)
	}
	slices.SortFunc(e.groups, func(a, b oracleGroup) int { return strings.Compare(a.key, b.key) })
}

// matchTrie walks the trie for topic.
func (o *oracle) matchTrie(topic string, publisher Handle) oracleExpect {
	e := oracleExpect{normal: map[Handle]*oracleAgg{}}
	levels := strings.Split(topic, "/")
	dollar := strings.HasPrefix(topic, "$")
	collect := func(n *oracleNode) {
		for h, s := range n.subs {
			e.add(h, s, publisher)
		}
		for g, m := range n.groups {
			e.groups = append(e.groups, oracleGroup{key: g + "\x00" + n.path, members: m})
		}
	}
	var walk func(n *oracleNode, i int)
	walk = func(n *oracleNode, i int) {
		wild := !(i == 0 && dollar)
		if n.hash != nil && wild {
			collect(n.hash) // '#' covers the parent level and all below
		}
		if i == len(levels) {
			collect(n)
			return
		}
		if c := n.children[levels[i]]; c != nil {
			walk(c, i+1)
		}
		if n.plus != nil && wild {
			walk(n.plus, i+1)
		}
	}
	walk(o.root, 0)
	e.finish()
	return e
}

// matchFlat tests every subscription with oracleMatches.
func (o *oracle) matchFlat(topic string, publisher Handle) oracleExpect {
	e := oracleExpect{normal: map[Handle]*oracleAgg{}}
	groups := map[string]map[Handle]oracleSub{}
	for k, s := range o.flat {
		group, inner, shared := oracleSplitShared(k.filter)
		if !oracleMatches(inner, topic) {
			continue
		}
		if !shared {
			e.add(k.h, s, publisher)
			continue
		}
		gk := group + "\x00" + inner
		if groups[gk] == nil {
			groups[gk] = map[Handle]oracleSub{}
		}
		groups[gk][k.h] = s
	}
	for gk, m := range groups {
		e.groups = append(e.groups, oracleGroup{key: gk, members: m})
	}
	e.finish()
	return e
}

// match computes the expectation both ways and fails if they disagree.
func (o *oracle) match(topic string, publisher Handle) (oracleExpect, error) {
	a := o.matchTrie(topic, publisher)
	b := o.matchFlat(topic, publisher)
	if err := sameExpect(a, b); err != nil {
		return a, fmt.Errorf("oracle trie and flat scan disagree on %q: %v", topic, err)
	}
	return a, nil
}

func sameExpect(a, b oracleExpect) error {
	if len(a.normal) != len(b.normal) {
		return fmt.Errorf("%d vs %d sessions", len(a.normal), len(b.normal))
	}
	for h, x := range a.normal {
		y := b.normal[h]
		if y == nil || x.qos != y.qos || !slices.Equal(x.ids, y.ids) {
			return fmt.Errorf("session %d: %+v vs %+v", h, x, y)
		}
	}
	if len(a.groups) != len(b.groups) {
		return fmt.Errorf("%d vs %d groups", len(a.groups), len(b.groups))
	}
	for i := range a.groups {
		if a.groups[i].key != b.groups[i].key || len(a.groups[i].members) != len(b.groups[i].members) {
			return fmt.Errorf("group %q vs %q", a.groups[i].key, b.groups[i].key)
		}
		for h, s := range a.groups[i].members {
			if t, ok := b.groups[i].members[h]; !ok || s != t {
				return fmt.Errorf("group %q member %d", a.groups[i].key, h)
			}
		}
	}
	return nil
}

func dedupSorted(ids []uint32) []uint32 {
	out := slices.Clone(ids)
	slices.Sort(out)
	return slices.Compact(out)
}

// verify checks a Match result against the expectation. offline is the set of
// sessions marked offline when Match ran.
func verify(e oracleExpect, r *Result, offline map[Handle]bool) error {
	seen := map[Handle]bool{}
	var shared []int
	for i, d := range r.Deliveries {
		if d.Handle == NoHandle {
			return fmt.Errorf("delivery %d has NoHandle", i)
		}
		if d.Shared {
			shared = append(shared, i)
			continue
		}
		if seen[d.Handle] {
			return fmt.Errorf("session %d delivered twice (non-shared)", d.Handle)
		}
		seen[d.Handle] = true
		a := e.normal[d.Handle]
		if a == nil {
			return fmt.Errorf("session %d delivered but no subscription of it matches", d.Handle)
		}
		if d.Opts.QoS() != a.qos {
			return fmt.Errorf("session %d: QoS %d, want %d", d.Handle, d.Opts.QoS(), a.qos)
		}
		got := r.IDs(i, nil)
		want := dedupSorted(a.ids)
		if g := dedupSorted(got); !slices.Equal(g, want) || len(got) > len(a.ids) {
			return fmt.Errorf("session %d: ids %v, want %v (one per matching subscription: %v)", d.Handle, got, want, a.ids)
		}
		if len(want) == 0 && d.ID != 0 {
			return fmt.Errorf("session %d: ID %d, want 0", d.Handle, d.ID)
		}
		if len(want) > 0 && !slices.Contains(want, d.ID) {
			return fmt.Errorf("session %d: ID %d not one of %v", d.Handle, d.ID, want)
		}
	}
	for h := range e.normal {
		if !seen[h] {
			return fmt.Errorf("session %d not delivered (non-shared)", h)
		}
	}
	if len(shared) != len(e.groups) {
		return fmt.Errorf("%d shared deliveries, want %d (one per group %v)", len(shared), len(e.groups), groupKeys(e.groups))
	}
	// Each shared delivery must be assigned to a distinct matching group of
	// which it is a valid pick: a bipartite matching.
	fits := func(di, gi int) bool {
		d := r.Deliveries[shared[di]]
		g := e.groups[gi]
		m, ok := g.members[d.Handle]
		if !ok || d.Opts.QoS() != m.opts.QoS() || d.ID != m.id {
			return false
		}
		ids := r.IDs(shared[di], nil)
		if m.id == 0 && len(ids) != 0 || m.id != 0 && !slices.Equal(ids, []uint32{m.id}) {
			return false
		}
		if offline[d.Handle] {
			for h := range g.members {
				if !offline[h] {
					return false // an online member was available
				}
			}
		}
		return true
	}
	owner := make([]int, len(e.groups)) // group -> delivery+1
	var try func(di int, visited []bool) bool
	try = func(di int, visited []bool) bool {
		for gi := range e.groups {
			if visited[gi] || !fits(di, gi) {
				continue
			}
			visited[gi] = true
			if owner[gi] == 0 || try(owner[gi]-1, visited) {
				owner[gi] = di + 1
				return true
			}
		}
		return false
	}
	for di := range shared {
		if !try(di, make([]bool, len(e.groups))) {
			d := r.Deliveries[shared[di]]
			return fmt.Errorf("shared delivery %+v fits no remaining group of %v", d, groupKeys(e.groups))
		}
	}
	return nil
}

func groupKeys(gs []oracleGroup) []string {
	var out []string
	for _, g := range gs {
		out = append(out, strings.ReplaceAll(g.key, "\x00", " "))
	}
	return out
}
