package matcher

import (
	"slices"
	"sync/atomic"
)

// Delivery is one session a message goes to, with the merged options of its
// matching subscriptions.
type Delivery struct {
	Handle Handle  // the receiving session
	ID     uint32  // a subscription identifier, 0 for none; IDs lists them all
	Opts   Options // QoS is the highest granted; other bits are or-ed
	Shared bool    // chosen from a $share group rather than subscribed directly
	more   uint32  // index+1 into Result.ids of further identifiers
}

// firstCell is a shape's key and the first cell of its probe run in Match.
type firstCell struct {
	key, at uint32
	cell    slot
}

// idLink chains a delivery's further subscription identifiers.
type idLink struct {
	id   uint32
	next uint32
}

// seenSlot maps a session to its delivery while a Result deduplicates.
type seenSlot struct {
	handle Handle
	pos    uint32
}

// Result receives what Match finds. Reuse one per goroutine: it keeps its
// buffers, so Match allocates nothing once they have grown.
type Result struct {
	Deliveries []Delivery // one per receiving session, then one per share group

	ids    []idLink
	cands  []uint32 // matching entries
	seen   []seenSlot
	seenN  int // slots of seen in use, 0 while deduplicating by linear scan
	sorted int // Deliveries[:sorted] is sorted by handle
	sums   [maxShapeDepth + 1]uint32
	firsts []firstCell
	touch  byte  // keeps Match's warming loads from being optimised away
	stripe uint8 // the index lock stripe this Result reads under, +1
}

// IDs appends the subscription identifiers of r.Deliveries[i] to dst.
func (r *Result) IDs(i int, dst []uint32) []uint32 {
	d := &r.Deliveries[i]
	if d.ID != 0 {
		dst = append(dst, d.ID)
	}
	for j := d.more; j != 0; j = r.ids[j-1].next {
		dst = append(dst, r.ids[j-1].id)
	}
	return dst
}

func (r *Result) reset() {
	r.Deliveries = r.Deliveries[:0]
	r.ids = r.ids[:0]
	r.cands = r.cands[:0]
	if r.seenN > 0 {
		clear(r.seen[:r.seenN])
		r.seenN = 0
	}
}

// collect turns the matching entries into deliveries. Handles are unique
// and sorted within one entry, so the entry with the most subscribers is
// copied as it is and the others are merged into it: by binary search in
// that sorted run, then among the deliveries added after it.
func (x *Index) collect(pub Handle, r *Result) {
	// The common case: every matching filter has one subscriber, and there
	// are few; merge them by a linear scan.
	simple := len(r.cands) <= linearDedup
	for _, ei := range r.cands {
		if !simple {
			break
		}
		simple = x.entry(ei).list() == 0
	}
	if simple {
		for _, ei := range r.cands {
			if s := x.entry(ei).one[0]; !s.ownEcho(pub) {
				r.mergeLinear(s, 0)
			}
		}
		return
	}
	base, most := -1, 0
	for ci, ei := range r.cands {
		if n := x.members(ei); n > most {
			base, most = ci, n
		}
	}
	if base >= 0 {
		x.mergeAll(base, pub, r)
	}
	for _, ei := range r.cands {
		if e := x.entry(ei); e.list() != 0 && isShared(e.filter) {
			x.pickShared(&x.lists[e.list()-1], r)
		}
	}
}

// mergeAll copies the subscribers of candidate base and merges those of
// the other non-shared candidates into them.
func (x *Index) mergeAll(base int, pub Handle, r *Result) {
	subs := x.subsOf(x.entry(r.cands[base]))
	r.Deliveries = slices.Grow(r.Deliveries, len(subs))
	d := r.Deliveries[:len(subs)]
	k := 0
	for _, s := range subs {
		if !s.ownEcho(pub) {
			d[k] = s.delivery()
			k++
		}
	}
	r.Deliveries, r.sorted = d[:k], k
	for ci, ei := range r.cands {
		if ci == base || x.members(ei) == 0 {
			continue
		}
		for _, s := range x.subsOf(x.entry(ei)) {
			if !s.ownEcho(pub) {
				r.merge(s)
			}
		}
	}
}

// members returns how many non-shared subscribers entry ei has; 0 for a
// share group.
func (x *Index) members(ei uint32) int {
	e := x.entry(ei)
	switch {
	case e.list() == 0:
		return 1
	case isShared(e.filter):
		return 0
	}
	return len(x.lists[e.list()-1].subs)
}

// subsOf returns the subscribers of a non-shared entry.
func (x *Index) subsOf(e *entry) []sub {
	if e.list() == 0 {
		return e.one[:]
	}
	return x.lists[e.list()-1].subs
}

// pickShared delivers to one member of a share group: the next online one
// after the last pick, or the next one at all when none is online, so that a
// persistent session still queues it [MQTT-4.8.2-3].
func (x *Index) pickShared(l *subList, r *Result) {
	n := uint32(len(l.subs))
	if n == 0 {
		return
	}
	for {
		start := atomic.LoadUint32(&l.next)
		pick := start % n
		for j := uint32(0); j < n; j++ {
			if c := (start + j) % n; !x.isOffline(l.subs[c].handle()) {
				pick = c
				break
			}
		}
		if atomic.CompareAndSwapUint32(&l.next, start, pick+1) {
			d := l.subs[pick].delivery()
			d.Shared = true
			r.Deliveries = append(r.Deliveries, d)
			return
		}
	}
}

// merge adds s to the delivery of its session, or appends a new delivery.
func (r *Result) merge(s sub) {
	sorted := r.Deliveries[:r.sorted]
	lo, hi := 0, len(sorted)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if sorted[m].Handle < s.handle() {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(sorted) && sorted[lo].Handle == s.handle() {
		r.combine(lo, s)
		return
	}
	if r.seenN == 0 && len(r.Deliveries)-r.sorted <= linearDedup {
		r.mergeLinear(s, r.sorted)
		return
	}
	if 2*(len(r.Deliveries)-r.sorted+1) > r.seenN {
		r.rehash()
	}
	mask := uint32(r.seenN - 1)
	h := s.handle()
	for i := uint32(h) * 0x9e3779b1 & mask; ; i = (i + 1) & mask {
		switch r.seen[i].handle {
		case h:
			r.combine(int(r.seen[i].pos), s)
			return
		case NoHandle:
			r.seen[i] = seenSlot{handle: h, pos: uint32(len(r.Deliveries))}
			r.Deliveries = append(r.Deliveries, s.delivery())
			return
		}
	}
}

// mergeLinear merges s into the deliveries from index from on, scanning
// them one by one, or appends it.
func (r *Result) mergeLinear(s sub, from int) {
	for i := from; i < len(r.Deliveries); i++ {
		if r.Deliveries[i].Handle == s.handle() {
			r.combine(i, s)
			return
		}
	}
	r.Deliveries = append(r.Deliveries, s.delivery())
}

// rehash sizes the dedup table for four times the deliveries added after
// the sorted run and fills it with them.
func (r *Result) rehash() {
	clear(r.seen[:r.seenN])
	n := 64
	for n < 4*(len(r.Deliveries)-r.sorted+1) {
		n *= 2
	}
	if cap(r.seen) < n {
		r.seen = make([]seenSlot, n)
	}
	r.seen, r.seenN = r.seen[:cap(r.seen)], n
	mask := uint32(n - 1)
	for p := r.sorted; p < len(r.Deliveries); p++ {
		d := &r.Deliveries[p]
		i := uint32(d.Handle) * 0x9e3779b1 & mask
		for r.seen[i].handle != NoHandle {
			i = (i + 1) & mask
		}
		r.seen[i] = seenSlot{handle: d.Handle, pos: uint32(p)}
	}
}

// combine merges s into delivery i: highest QoS, all identifiers.
func (r *Result) combine(i int, s sub) {
	d := &r.Deliveries[i]
	q := d.Opts & QoSMask
	o := s.opts()
	if o&QoSMask > q {
		q = o & QoSMask
	}
	d.Opts = (d.Opts|o)&^QoSMask | q
	if s.id == 0 {
		return
	}
	if d.ID == 0 {
		d.ID = s.id
		return
	}
	r.ids = append(r.ids, idLink{id: s.id, next: d.more})
	d.more = uint32(len(r.ids))
}
