package matcher

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Tuning constants.
const (
	// maxShapeDepth is the deepest filter that gets a shape of its own. The
	// '+' positions of a shape are a uint32 bit set, and real fleets stay far
	// below 32 levels; deeper filters live on a list that is verified one by
	// one, and only for topics deeper than this.
	maxShapeDepth = 32

	// pageShift sets the entry page size (1,024 entries, 24 KiB on 64-bit).
	// Pages instead of one growing slice keep growth from copying the whole
	// index and bound the slack to one page.
	pageShift = 10
	pageSize  = 1 << pageShift

	// maxLoadNum/maxLoadDen is the table's load limit. Linear probing stays
	// short below 3/4; most probes are for shapes that do not match, and an
	// unsuccessful search grows with 1/(1-load)².
	maxLoadNum, maxLoadDen = 3, 4

	// minSlots is the size of a new shape's table: 128 bytes, since most
	// shapes hold few filters.
	minSlots = 16

	// linearDedup is how many deliveries a Result scans linearly for a
	// session before it switches to its hash table.
	linearDedup = 16

	// cachedCells is the table size, in cells of 8 bytes over all shapes,
	// up to which Match probes shape by shape. Beyond it (512 KiB, the L2
	// cache of a Pi Zero 2 W's Cortex-A53 cluster) most probes miss the
	// cache, and Match first issues every shape's load, then every
	// candidate's, so that the misses overlap.
	cachedCells = 1 << 16
)

// stripe is one of the index's read-write locks, alone on its cache line.
type stripe struct {
	sync.RWMutex
	_ [64 - unsafe.Sizeof(sync.RWMutex{})%64]byte
}

// lockStripes is how many read-write locks the index spreads readers over.
// A single RWMutex makes every reader write its one counter, and on four
// cores that cache line bounces between them on every publish; a reader
// takes only its Result's stripe, and a writer takes them all.
const lockStripes = 8

// nextStripe deals stripes to Results in turn, so that goroutines, each
// with its own Result, spread over the stripes.
var nextStripe atomic.Uint32

// rlock read-locks the stripe of r and returns it.
func (x *Index) rlock(r *Result) *stripe {
	if r.stripe == 0 {
		r.stripe = uint8(nextStripe.Add(1)%lockStripes) + 1
	}
	l := &x.locks[r.stripe-1]
	l.RLock()
	return l
}

// lock write-locks every stripe, in order.
func (x *Index) lock() {
	for i := range x.locks {
		x.locks[i].Lock()
	}
}

// unlock releases what lock took.
func (x *Index) unlock() {
	for i := range x.locks {
		x.locks[i].Unlock()
	}
}

// Handle identifies a session in the index: a small integer the broker
// assigns. The index stores handles, never client identifiers.
type Handle uint32

// NoHandle is the zero Handle: no session. Match takes it as the publisher
// when the message comes from no session.
const NoHandle Handle = 0

// Options is the MQTT 5 subscription options byte, in its wire layout.
type Options uint8

// Subscription option bits [MQTT-3.8.3.1].
const (
	QoSMask            Options = 0x03 // maximum QoS granted
	NoLocal            Options = 0x04 // do not deliver the session's own publishes
	RetainAsPublished  Options = 0x08 // keep the retain flag as published
	RetainHandlingMask Options = 0x30 // when to send retained messages on subscribe
)

// QoS returns the maximum QoS of the subscription.
func (o Options) QoS() byte { return byte(o & QoSMask) }

// RetainHandling returns the retain handling value 0, 1 or 2.
func (o Options) RetainHandling() byte { return byte(o&RetainHandlingMask) >> 4 }

// sub is one subscriber of a filter in 8 bytes: the session handle and the
// options byte's six bits share one word, the subscription identifier
// (at most 28 bits in MQTT) has the other. In an entry's inline cell, the
// QoS value 3, which is never granted, marks a reference to a member list
// instead.
type sub struct {
	ho uint32 // handle<<6 | options
	id uint32
}

// MaxHandle is the largest session handle the index stores: handles share
// a word with the subscription options.
const MaxHandle Handle = 1<<26 - 1

// listMark in the QoS bits of an inline cell marks a list reference.
const listMark = 3

func newSub(h Handle, opts Options, id uint32) sub {
	return sub{ho: uint32(h)<<6 | uint32(opts&0x3f), id: id}
}

func (s sub) handle() Handle { return Handle(s.ho >> 6) }
func (s sub) opts() Options  { return Options(s.ho & 0x3f) }

// ownEcho reports whether a message from publisher pub must skip s: a No
// Local subscription never receives its own session's publishes
// [MQTT-3.8.3-3].
func (s sub) ownEcho(pub Handle) bool { return s.opts()&NoLocal != 0 && s.handle() == pub }

// delivery is the Delivery of this subscriber alone.
func (s sub) delivery() Delivery { return Delivery{Handle: s.handle(), ID: s.id, Opts: s.opts()} }

// entry is one stored filter: 24 bytes on 64-bit, 16 on 32-bit. A filter
// with one subscriber keeps it inline; more subscribers, and every shared
// group, use a subList, referenced from the same cell.
type entry struct {
	filter string // as subscribed, "$share/g/..." included
	one    [1]sub // the only subscriber, a list reference, or zero when empty
}

// list returns the index+1 of the entry's member list, 0 when it has none.
func (e *entry) list() uint32 {
	if s := e.one[0]; s.ho&uint32(QoSMask) == listMark {
		return s.ho >> 6
	}
	return 0
}

// setList makes the entry refer to member list li (index+1).
func (e *entry) setList(li uint32) { e.one[0] = sub{ho: li<<6 | listMark} }

// subList holds the members of a filter with several subscribers, sorted by
// handle so that a session is found by binary search.
type subList struct {
	subs []sub
	next uint32 // round-robin cursor of a shared group, advanced atomically
}

// slot is one cell of the open-addressing table: the 32-bit key (it gives
// the home cell, so the table regrows and deletes without looking at
// entries) and the entry index+1, 0 when the cell is empty.
type slot struct {
	tag uint32
	idx uint32
}

// shapeKey names a filter's shape: its level count (or, with a trailing
// '#', the number of levels before it), the set of '+' levels, and the '#'.
type shapeKey struct {
	plus  uint32
	depth uint8
	hash  bool
}

// probe is a shape as Match walks it: only what computing a key needs.
type probe struct {
	plus  uint32
	depth uint8
	wild  bool
	t     *table
}

// table is one shape's open-addressing table of entries, keyed by the sum of
// the level terms of their literal levels. A table per shape keeps the
// tables of rare shapes small enough to stay in cache, so the probes a
// publish makes for them rarely reach memory.
type table struct {
	slots []slot
	used  int // filled slots
}

// Index is the subscription index: it maps a topic to the sessions whose
// filters match it. See the package documentation for its structure.
type Index struct {
	locks [lockStripes]stripe
	seed  uint // secret start of every level hash
	cells int  // cells in all shape tables
	batch int  // cells beyond which Match probes in phases: cachedCells

	pages     [][]entry
	freeEnt   []uint32
	lists     []subList
	freeLists []uint32

	shapes map[shapeKey]*table
	// probes[n] lists the shapes a topic of n levels can match: those of n
	// levels without '#', and those ending in '#' after at most n levels;
	// probes[maxShapeDepth+1] serves topics deeper than maxShapeDepth.
	probes [maxShapeDepth + 2][]probe
	deep   []uint32

	offline []uint64 // bit set of handles marked offline
	subs    int
}

// NewIndex returns an empty index.
func NewIndex() *Index {
	return &Index{
		seed:   uint(rand.Uint64()),
		shapes: make(map[shapeKey]*table),
		batch:  cachedCells,
	}
}

// Len returns the number of subscriptions: (session, filter) pairs.
func (x *Index) Len() int {
	x.locks[0].RLock()
	defer x.locks[0].RUnlock()
	return x.subs
}

// Filters returns the number of distinct filters stored; each share group
// of a filter counts once.
func (x *Index) Filters() int {
	x.locks[0].RLock()
	defer x.locks[0].RUnlock()
	n := len(x.deep)
	for _, t := range x.shapes {
		n += t.used
	}
	return n
}

// Shapes returns the number of distinct filter shapes Match probes.
func (x *Index) Shapes() int {
	x.locks[0].RLock()
	defer x.locks[0].RUnlock()
	return len(x.shapes)
}

// mix64 is a 64-bit finaliser: it spreads every input bit over the output.
func mix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// Level hashing. A level's hash is seeded with the index's secret and
// reads the level a machine word at a time; a finaliser then spreads it and
// an odd constant of the level's position multiplies it, so that "a/b" and
// "b/a" differ. That product is the level's 32-bit term. A filter's key is
// the sum of the terms of its literal levels, kept in its shape's table, so a
// topic's key for any shape is its prefix sum up to the shape's depth, less
// the terms at the shape's '+' levels. Keys are 32 bits: the
// table compares no more, and every candidate is verified anyway. Words are
// the machine's own (8 bytes on 64-bit boards, 4 on ARMv6/v7), so 32-bit
// targets never pay for 64-bit arithmetic. The secret seed keeps crafted
// topics from piling up in one probe run.
const (
	wordBytes = bits.UintSize / 8
	wordMask  = 1<<bits.UintSize - 1
	hashK1    = uint(0x9e3779b97f4a7c15 & wordMask)
	hashK2    = uint(0xd6e8feb86659fd93 & wordMask)
	ones      = ^uint(0) / 0xff // 0x01 in every byte
	highs     = ones << 7       // 0x80 in every byte
	slashes   = ones * '/'      // '/' in every byte
)

// A level is hashed in word-sized chunks taken from its first byte, the
// last chunk zero-padded; each chunk is folded in with a multiplication.
// Topics are scanned with the same chunks, which also find the '/'
// separators a word at a time, so hashing a topic is one pass with no call
// per level.

// load returns the bytes of b from i on, at most a word, little-endian, as
// the low bytes of a word. Bytes past the end of b read as zero; bytes past
// the level being hashed must be masked by the caller.
func load(b []byte, i int) uint {
	if i+wordBytes <= len(b) {
		return loadWord(b[i:])
	}
	if len(b) >= wordBytes {
		return loadWord(b[len(b)-wordBytes:]) >> (8 * uint(i+wordBytes-len(b)))
	}
	var w uint
	for k := len(b) - 1; k >= i; k-- {
		w = w<<8 | uint(b[k])
	}
	return w
}

// loadWord reads one little-endian machine word.
func loadWord(b []byte) uint {
	if wordBytes == 8 {
		return uint(binary.LittleEndian.Uint64(b))
	}
	return uint(binary.LittleEndian.Uint32(b))
}

// lowBytes keeps the low n bytes of a word.
func lowBytes(w uint, n int) uint {
	if n >= wordBytes {
		return w
	}
	return w & (1<<(8*uint(n)) - 1)
}

// fold mixes one chunk into a level hash.
func fold(h, w uint) uint {
	h = (h ^ w) * hashK1
	return h ^ h>>(bits.UintSize/2-3)
}

// bytesOf views a string's bytes without copying; they are only read.
func bytesOf(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// levelHash hashes one level the way topicSums hashes a topic's levels.
func (x *Index) levelHash(level string) uint {
	b := bytesOf(level)
	h := x.seed
	for i := 0; i < len(b); i += wordBytes {
		h = fold(h, lowBytes(load(b, i), len(b)-i))
	}
	return h + uint(len(b))
}

// levelTerm turns the hash of the level at position i into its term.
func levelTerm(h uint, i int) uint32 {
	h ^= h >> (bits.UintSize / 2)
	h *= hashK2
	h ^= h >> (bits.UintSize/2 - 3)
	return uint32(h) * positionFactor[i]
}

// literalTerm is the term of a literal filter level at position i.
func (x *Index) literalTerm(level string, i int) uint32 {
	return levelTerm(x.levelHash(level), i)
}

// positionFactor holds an odd multiplier per level position.
var positionFactor = func() (f [maxShapeDepth]uint32) {
	for i := range f {
		f[i] = uint32(mix64(uint64(i)+1)) | 1
	}
	return f
}()

// analyse returns the shape and key of a valid non-shared filter, or
// deep=true when it has no shape.
func (x *Index) analyse(filter string) (k shapeKey, key uint32, deep bool) {
	var sum uint32
	n := 0
	for start := 0; ; n++ {
		end := strings.IndexByte(filter[start:], '/')
		level := filter[start:]
		if end >= 0 {
			level = filter[start : start+end]
		}
		if level == "#" {
			k.hash = true
			break
		}
		if n >= maxShapeDepth {
			return k, 0, true
		}
		if level == "+" {
			k.plus |= 1 << n
		} else {
			sum += x.literalTerm(level, n)
		}
		if end < 0 {
			n++
			break
		}
		start += end + 1
	}
	k.depth = uint8(n)
	return k, sum, false
}

func (x *Index) entry(i uint32) *entry {
	return &x.pages[i>>pageShift][i&(pageSize-1)]
}

// isShared reports whether a valid filter is a shared subscription.
func isShared(f string) bool { return strings.HasPrefix(f, sharePrefix) }

// innerFilter strips a $share/{group}/ prefix.
func innerFilter(f string) (string, bool) {
	if _, inner, ok := SplitShared(f); ok {
		return inner, true
	}
	return f, false
}

// Subscribe adds h's subscription to filter, or replaces its options and
// identifier when h already has one on exactly that filter (and share group).
// filter may be a shared subscription $share/{group}/{filter}. id is the MQTT 5
// subscription identifier, 0 for none. The index keeps the filter string as
// given, so pass one that does not pin a larger buffer.
func (x *Index) Subscribe(h Handle, filter string, opts Options, id uint32) (replaced bool, err error) {
	if err := ValidateFilter(filter); err != nil {
		return false, err
	}
	if h == NoHandle || h > MaxHandle {
		return false, &Error{"filter", filter, -1, ErrNoHandle}
	}
	if opts.QoS() == listMark {
		// Stored inline, it would read as a member list reference.
		return false, &Error{"filter", filter, -1, ErrQoS}
	}
	inner, shared := innerFilter(filter)
	if shared && opts&NoLocal != 0 {
		return false, &Error{"filter", filter, -1, ErrShareNoLocal}
	}
	k, key, deep := x.analyse(inner)
	s := newSub(h, opts, id)

	x.lock()
	defer x.unlock()
	t := x.shapes[k]
	ei, found := x.find(t, filter, key, deep)
	if !found {
		ei = x.newEntry(filter, shared)
		switch {
		case deep:
			x.deep = append(x.deep, ei)
		case t == nil:
			t = &table{}
			x.shapes[k] = t
			x.rebuildProbes()
			fallthrough
		default:
			before := len(t.slots)
			t.insert(key, ei)
			x.cells += len(t.slots) - before
		}
	}
	replaced = x.addSub(ei, s)
	if !replaced {
		x.subs++
	}
	return replaced, nil
}

// Unsubscribe removes h's subscription to filter (the exact string it
// subscribed with) and reports whether there was one.
func (x *Index) Unsubscribe(h Handle, filter string) bool {
	if ValidateFilter(filter) != nil {
		return false
	}
	inner, _ := innerFilter(filter)
	k, key, deep := x.analyse(inner)

	x.lock()
	defer x.unlock()
	t := x.shapes[k]
	ei, found := x.find(t, filter, key, deep)
	if !found || !x.removeSub(ei, h) {
		return false
	}
	x.subs--
	e := x.entry(ei)
	if e.one[0] == (sub{}) {
		if deep {
			for i, d := range x.deep {
				if d == ei {
					x.deep = append(x.deep[:i], x.deep[i+1:]...)
					break
				}
			}
		} else if t.delete(key, ei); t.used == 0 {
			delete(x.shapes, k)
			x.cells -= len(t.slots)
			x.rebuildProbes()
		}
		*e = entry{}
		x.freeEnt = append(x.freeEnt, ei)
	}
	return true
}

// find locates the entry of filter in its shape's table t (nil when the
// shape has none yet) or on the deep list. Callers hold mu.
func (x *Index) find(t *table, filter string, key uint32, deep bool) (uint32, bool) {
	if deep {
		for _, ei := range x.deep {
			if x.entry(ei).filter == filter {
				return ei, true
			}
		}
		return 0, false
	}
	if t == nil {
		return 0, false
	}
	for i := t.home(key); ; i = t.next(i) {
		s := t.slots[i]
		if s.idx == 0 {
			return 0, false
		}
		if s.tag == key && x.entry(s.idx-1).filter == filter {
			return s.idx - 1, true
		}
	}
}

func (x *Index) newEntry(filter string, shared bool) uint32 {
	var ei uint32
	if n := len(x.freeEnt); n > 0 {
		ei = x.freeEnt[n-1]
		x.freeEnt = x.freeEnt[:n-1]
	} else {
		last := len(x.pages) - 1
		if last < 0 || len(x.pages[last]) == pageSize {
			x.pages = append(x.pages, make([]entry, 0, pageSize))
			last++
		}
		ei = uint32(last<<pageShift | len(x.pages[last]))
		x.pages[last] = x.pages[last][:len(x.pages[last])+1]
	}
	e := x.entry(ei)
	*e = entry{filter: filter}
	if shared {
		// A shared group always has a list: it needs the round-robin cursor.
		e.setList(x.newList())
	}
	return ei
}

func (x *Index) newList() uint32 {
	if n := len(x.freeLists); n > 0 {
		li := x.freeLists[n-1]
		x.freeLists = x.freeLists[:n-1]
		return li + 1
	}
	x.lists = append(x.lists, subList{})
	return uint32(len(x.lists))
}

func (x *Index) freeList(li uint32) {
	x.lists[li-1] = subList{}
	x.freeLists = append(x.freeLists, li-1)
}

// search returns the position of h in a sorted member list.
func search(subs []sub, h Handle) (int, bool) {
	lo, hi := 0, len(subs)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if subs[m].handle() < h {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(subs) && subs[lo].handle() == h
}

// addSub adds or replaces a subscriber of entry ei; true when replaced.
func (x *Index) addSub(ei uint32, s sub) bool {
	e := x.entry(ei)
	if e.list() == 0 {
		switch e.one[0].handle() {
		case NoHandle:
			e.one[0] = s
			return false
		case s.handle():
			e.one[0] = s
			return true
		}
		li := x.newList()
		x.lists[li-1].subs = []sub{e.one[0]}
		e.setList(li)
	}
	l := &x.lists[e.list()-1]
	i, ok := search(l.subs, s.handle())
	if ok {
		l.subs[i] = s
		return true
	}
	l.subs = append(l.subs, sub{})
	copy(l.subs[i+1:], l.subs[i:])
	l.subs[i] = s
	return false
}

// removeSub removes h from entry ei; an unshared list of one goes back inline.
func (x *Index) removeSub(ei uint32, h Handle) bool {
	e := x.entry(ei)
	li := e.list()
	if li == 0 {
		if e.one[0].handle() != h || h == NoHandle {
			return false
		}
		e.one[0] = sub{}
		return true
	}
	l := &x.lists[li-1]
	i, ok := search(l.subs, h)
	if !ok {
		return false
	}
	l.subs = append(l.subs[:i], l.subs[i+1:]...)
	_, shared := innerFilter(e.filter)
	switch {
	case len(l.subs) == 0:
		x.freeList(li)
		e.one[0] = sub{}
	case len(l.subs) == 1 && !shared:
		e.one[0] = l.subs[0]
		x.freeList(li)
	}
	return true
}

// rebuildProbes lays out the shapes for Match, by topic depth. It runs only
// when a shape appears or disappears, which real fleets do a handful of
// times.
func (x *Index) rebuildProbes() {
	for i := range x.probes {
		x.probes[i] = x.probes[i][:0]
	}
	for k, t := range x.shapes {
		p := probe{plus: k.plus, depth: k.depth, wild: k.plus != 0 || k.hash, t: t}
		if !k.hash {
			x.probes[k.depth] = append(x.probes[k.depth], p)
			continue
		}
		for n := int(k.depth); n < len(x.probes); n++ {
			x.probes[n] = append(x.probes[n], p)
		}
	}
}

// insert adds the cell of entry ei under key.
func (t *table) insert(key, ei uint32) {
	if (t.used+1)*maxLoadDen > len(t.slots)*maxLoadNum {
		t.grow()
	}
	i := t.home(key)
	for t.slots[i].idx != 0 {
		i = t.next(i)
	}
	t.slots[i] = slot{tag: key, idx: ei + 1}
	t.used++
}

// grow makes the table half as large again; the keys in the cells place
// them anew. Growing by half rather than doubling, with sizes that need not
// be powers of two, keeps a table between 50% and 75% full instead of 37%
// and 75%: at a million filters that saves about 6 bytes a subscription.
func (t *table) grow() {
	old := t.slots
	t.slots = make([]slot, max(minSlots, len(old)+len(old)/2))
	for _, s := range old {
		if s.idx == 0 {
			continue
		}
		i := t.home(s.tag)
		for t.slots[i].idx != 0 {
			i = t.next(i)
		}
		t.slots[i] = s
	}
}

// home returns the cell where key's probe run starts: the key scaled to the
// table size, which need not be a power of two.
func (t *table) home(key uint32) uint32 {
	return uint32(uint64(key) * uint64(len(t.slots)) >> 32)
}

// next returns the cell after i, wrapping at the end of the table.
func (t *table) next(i uint32) uint32 {
	if i++; i == uint32(len(t.slots)) {
		return 0
	}
	return i
}

// delete empties the cell of entry ei and shifts later cells of the probe
// run back, so the table never needs tombstones.
func (t *table) delete(key, ei uint32) {
	i := t.home(key)
	for t.slots[i].idx != ei+1 {
		i = t.next(i)
	}
	for j := i; ; {
		j = t.next(j)
		if t.slots[j].idx == 0 {
			break
		}
		home := t.home(t.slots[j].tag)
		// Leave the cell where it is when its home lies cyclically in (i, j].
		if (i <= j && i < home && home <= j) || (i > j && (i < home || home <= j)) {
			continue
		}
		t.slots[i] = t.slots[j]
		i = j
	}
	t.slots[i] = slot{}
	t.used--
}

// SetOnline marks a session online or offline. Shared groups skip offline
// members while an online one is left. Every handle starts online.
func (x *Index) SetOnline(h Handle, online bool) {
	x.lock()
	defer x.unlock()
	w, b := int(h>>6), uint64(1)<<(h&63)
	if online {
		if w < len(x.offline) {
			x.offline[w] &^= b
		}
		return
	}
	for w >= len(x.offline) {
		x.offline = append(x.offline, 0)
	}
	x.offline[w] |= b
}

func (x *Index) isOffline(h Handle) bool {
	w := int(h >> 6)
	return w < len(x.offline) && x.offline[w]&(1<<(h&63)) != 0
}

// wildCand marks a candidate of a wildcard shape in Match; entry numbers
// stay far below it.
const wildCand = 1 << 31

// Match resets r and fills r.Deliveries with the sessions whose filters
// match topic, a valid topic name. Non-shared matches give one Delivery per
// session with the highest QoS of its matching subscriptions and all their
// identifiers [MQTT-3.3.4-2, MQTT-3.3.4-3]; each matching share group gives
// one Delivery for one member, chosen round robin among online members.
// Subscriptions with No Local are skipped for the publisher's own session
// [MQTT-3.8.3-3]; pass NoHandle when the publisher is no session. Match
// allocates nothing once r has grown to the sizes it needs.
func (x *Index) Match(topic string, publisher Handle, r *Result) {
	r.reset()
	l := x.rlock(r)
	defer l.RUnlock()

	// sums[i] is the sum of the terms of the topic's first i levels.
	sums := &r.sums
	n, deep := x.topicSums(topic, sums)
	probes := x.probes[n]
	if deep {
		probes = x.probes[maxShapeDepth+1]
	}
	if x.cells > x.batch {
		x.probeBatched(probes, topic, r)
	} else {
		x.probeEach(probes, topic, r)
	}
	if deep {
		for _, ei := range x.deep {
			f, _ := innerFilter(x.entry(ei).filter)
			if Matches(f, topic) {
				r.cands = append(r.cands, ei)
			}
		}
	}
	x.collect(publisher, r)
}

// key returns the key of probe p's shape for the topic whose prefix
// sums are in sums.
func (p *probe) key(sums *[maxShapeDepth + 1]uint32) uint32 {
	sum := sums[p.depth]
	for plus := p.plus; plus != 0; plus &= plus - 1 {
		i := bits.TrailingZeros32(plus)
		sum -= sums[i+1] - sums[i]
	}
	return sum
}

// probeEach probes one shape after the other and verifies as it goes: the
// fastest order while the tables fit in the cache.
func (x *Index) probeEach(probes []probe, topic string, r *Result) {
	for k := range probes {
		p := &probes[k]
		key := p.key(&r.sums)
		for i := p.t.home(key); ; i = p.t.next(i) {
			s := p.t.slots[i]
			if s.idx == 0 {
				break
			}
			if s.tag != key {
				continue
			}
			f, _ := innerFilter(x.entry(s.idx - 1).filter)
			// Hashes only prune: every candidate is checked against the topic.
			if p.wild && Matches(f, topic) || !p.wild && f == topic {
				r.cands = append(r.cands, s.idx-1)
			}
		}
	}
}

// probeBatched does the work of probeEach in phases, for tables larger than
// the cache.
func (x *Index) probeBatched(probes []probe, topic string, r *Result) {
	// Phase 1: every shape's key and the first cell of its probe run. These
	// loads do not depend on each other, so in a large index their cache
	// misses overlap instead of queuing one behind the other.
	r.firsts = r.firsts[:0]
	for _, p := range probes {
		sum := p.key(&r.sums)
		at := p.t.home(sum)
		r.firsts = append(r.firsts, firstCell{key: sum, at: at, cell: p.t.slots[at]})
	}
	// Phase 2: walk each probe run and collect the entries with the key.
	for j, p := range probes {
		f := r.firsts[j]
		for s, i := f.cell, f.at; s.idx != 0; {
			if s.tag == f.key {
				c := s.idx - 1
				if p.wild {
					c |= wildCand
				}
				r.cands = append(r.cands, c)
			}
			i = p.t.next(i)
			s = p.t.slots[i]
		}
	}
	// Phase 3: bring in each candidate's entry and the end of its filter
	// string, again with independent loads, then verify every candidate:
	// hashes only prune.
	var touch byte
	for _, c := range r.cands {
		f := x.entry(c &^ wildCand).filter
		touch ^= f[len(f)-1]
	}
	r.touch = touch
	kept := r.cands[:0]
	for _, c := range r.cands {
		ei := c &^ wildCand
		f, _ := innerFilter(x.entry(ei).filter)
		if c&wildCand == 0 && f == topic || c&wildCand != 0 && Matches(f, topic) {
			kept = append(kept, ei)
		}
	}
	r.cands = kept
}

// topicSums hashes the topic's levels into prefix sums of their terms. It
// returns the number of levels hashed and whether more than maxShapeDepth
// levels follow, in which case only the first maxShapeDepth are hashed.
func (x *Index) topicSums(topic string, sums *[maxShapeDepth + 1]uint32) (n int, deep bool) {
	b := bytesOf(topic)
	h, start := x.seed, 0
	for pos := 0; ; {
		w := load(b, pos)
		avail := len(b) - pos
		// A zero byte in w^slashes is a '/': the lowest one is found exactly.
		t := w ^ slashes
		if z := (t - ones) &^ t & highs; z != 0 {
			if k := bits.TrailingZeros(z) >> 3; k < avail {
				if k > 0 {
					h = fold(h, lowBytes(w, k))
				}
				sums[n+1] = sums[n] + levelTerm(h+uint(pos+k-start), n)
				n++
				if n == maxShapeDepth {
					return n, true
				}
				pos += k + 1
				h, start = x.seed, pos
				continue
			}
		}
		if avail <= wordBytes {
			if avail > 0 {
				h = fold(h, lowBytes(w, avail))
			}
			sums[n+1] = sums[n] + levelTerm(h+uint(len(b)-start), n)
			return n + 1, false
		}
		h = fold(h, w)
		pos += wordBytes
	}
}
