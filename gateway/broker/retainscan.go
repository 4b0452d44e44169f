package broker

import (
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fieldgate/fieldgate/matcher"
)

// A retained scan streams a new subscription's retained messages to its
// session as the client takes them, rather than all at once: a # over
// twenty thousand retained messages of 8 KB would otherwise be read into
// memory whole (160 MB on a 512 MB board) and then mostly dropped at the
// client's byte budget.
//
// A scan reads the state file a page at a time (storage.RetainedPage: one
// short read transaction, in topic order, from a cursor) and hands each
// message to session.deliverLocked only while the client has room for
// it: its outbound queue under half of broker.max_queued_bytes, and for
// QoS 1/2 a free slot in its window or, failing that, its pending queue
// under half that budget; the other halves are left for live messages. What does not fit waits in the file, not in memory. It goes
// on when room comes back: a PUBACK or PUBCOMP (from the connection's
// reader), a batch written (from its writer), a returning client (attach).
// Each of those calls pump; one page at a time runs, on whichever
// goroutine called, and the client's own goroutines pay for its scan.
//
// Retained messages held only in memory ($SYS topics, or all of them without
// a state file), and stored topics whose latest change the file may not
// have yet, are read at the start into mem: pointers to messages the
// store holds anyway.
//
// The retainedStore's numbering still decides what a scan sends: a topic
// goes only while its latest change is numbered at or below the scan's
// scanTo, checked under the store's lock and the session's at the moment
// of delivery, so each retained change reaches the subscription once, live
// or from the scan, and never a value older than one it got live. Live
// messages are no longer held back until the scan ends: a live message on
// a topic the scan has not reached can come before its retained copy.
//
// A scan ends when it has gone through the file, when its subscription is
// unsubscribed or made again, and when the session ends. It lives in the
// session, so a persistent session's scan waits while its client is away
// and goes on from its cursor when the client comes back; it is not
// stored, so a restart of the broker ends it.
//
// What scans hold is bounded. An ended scan holds nothing: it leaves the
// session's list (its slot cleared), and its filter is the subscription's
// own string, never a slice of the SUBSCRIBE packet, which would keep the
// packet whole. A scan under way holds its cursor and, until the file
// part begins, pointers to the messages only memory had at its start ($SYS
// topics and changes not yet in the file); a session has at most one per
// subscription (broker.max_subscriptions, within its filter bytes), and
// persistent sessions are bounded too. Pages read from the file are
// delivered or let go within the pump. The store keeps the changes the
// file has while scans are under way, which a scan stalled for good (a
// persistent session whose client never returns) would otherwise make
// grow with every topic changed: past recentKeep of them it forgets them
// and raises its floor, and a scan begun before then rebases on its next
// step (rebaseLocked), sending topics past its cursor as they are now.

// scanPage bounds the messages of one page: at most a default window's
// worth, so one step delivers a window-full and a QoS 0 scan's page stays
// well under the client's byte budget at typical sensor sizes.
const scanPage = 64

// retainedScan is one subscription's retained messages on their way to
// it. Its fields are guarded by the session's mu, except that while a
// pump reads a page without it, only that pump moves the cursor.
type retainedScan struct {
	filter string   // as subscribed; never shared
	scanTo uint64   // the retained change the scan goes up to (see retainedStore)
	qos    byte     // granted
	ids    []uint32 // subscription identifiers its deliveries carry

	mem  []*message          // read from memory at the start, sent before the file
	held map[string]struct{} // stored topics whose message is in mem: the file's copy is skipped

	after    string // the last topic read from the file; empty before the first
	fileDone bool   // the file holds no more topics the filter can match
	ended    bool
}

// scanState is a session's retained scans under way.
type scanState struct {
	list    []*retainedScan // guarded by session.mu, oldest first
	pumping bool            // guarded by session.mu: a pump is running
	n       atomic.Int32    // len(list), read without the lock by the paths that call pump
}

// startScan begins the retained scan of w for a subscription with the
// given identifiers: it reads what only memory knows. The caller holds
// the session's lock; the scan is one of those subscribe counted.
func (r *retainedStore) startScan(w retainedFor, ids []uint32) *retainedScan {
	sc := &retainedScan{filter: w.filter, scanTo: w.scanTo, qos: w.qos, ids: ids, fileDone: r.db == nil}
	r.mu.RLock()
	defer r.mu.RUnlock()
	r.captureLocked(sc)
	return sc
}

// captureLocked reads into sc.mem the messages of sc's filter that only
// memory knows, as of sc.scanTo, and notes in sc.held the stored topics
// among them; once the file part has begun (sc.after set), only stored
// topics past its cursor, since the others it has passed and memory's
// own topics went first. The caller holds r.mu.
func (r *retainedStore) captureLocked(sc *retainedScan) {
	fromRecent := func(topic string, c *recentChange) {
		if c.inFile || (sc.after != "" && topic <= sc.after) {
			return
		}
		if sc.held == nil {
			sc.held = make(map[string]struct{})
		}
		sc.held[topic] = struct{}{}
		if c.m != nil && c.seq <= sc.scanTo {
			sc.mem = append(sc.mem, c.m)
		}
	}
	fromMemory := sc.after == ""
	if !strings.ContainsAny(sc.filter, "+#") {
		if e, ok := r.topics[sc.filter]; ok && fromMemory && e.seq <= sc.scanTo {
			sc.mem = append(sc.mem, e.m)
		}
		if c := r.recent[sc.filter]; c != nil {
			fromRecent(sc.filter, c)
		}
		return
	}
	if fromMemory {
		for t, e := range r.topics {
			if e.seq <= sc.scanTo && matcher.Matches(sc.filter, t) {
				sc.mem = append(sc.mem, e.m)
			}
		}
	}
	for t, c := range r.recent {
		if matcher.Matches(sc.filter, t) {
			fromRecent(t, c)
		}
	}
}

// behindLocked reports whether changes sc may need have been forgotten
// (see retainedStore.floor). The caller holds r.mu.
func (r *retainedStore) behindLocked(sc *retainedScan) bool {
	return sc.scanTo < r.floor
}

// rebaseLocked moves sc, which is behind, up to the latest change: the
// subscription has been in the index since its first scanTo, so every
// change since went to it live, and the scan now sends a topic past its
// cursor only as it is now. What it had read from memory is read again,
// since the changes that could tell it was replaced are forgotten. A
// topic changed since the scan began can so reach the subscription twice,
// live and from the scan, both times its latest value; never an older
// value after a newer one. The caller holds the session's lock and r.mu.
func (r *retainedStore) rebaseLocked(sc *retainedScan) {
	clear(sc.mem)
	sc.mem, sc.held = nil, nil
	sc.scanTo = r.seq
	r.captureLocked(sc)
}

// currentLocked reports whether m, read by sc from memory (fromFile
// false) or from the file, is still its topic's retained message as of
// the scan's number: not replaced or cleared by a change sent live. The
// caller holds r.mu.
func (r *retainedStore) currentLocked(sc *retainedScan, m *message, fromFile bool) bool {
	if !r.stored(m.topic) {
		e, ok := r.topics[m.topic]
		return ok && e.m == m
	}
	if fromFile {
		if _, ok := sc.held[m.topic]; ok {
			return false
		}
	}
	// Changes are kept in recent while any scan is under way, up to
	// keepMax of them; a scan that is not behind the floor (checked by
	// the caller under the same lock) sees every change made since it
	// began, so a topic without one has not changed since.
	c := r.recent[m.topic]
	if c == nil {
		return true
	}
	if c.seq > sc.scanTo {
		return false
	}
	// A change at or below scanTo the file did not have at the start
	// was held, and its message is in mem.
	return !fromFile || c.inFile
}

// sendRetained starts the retained scans of filters, for a new
// subscription with identifiers ids, after queueing first (the SUBACK),
// and delivers what the client has room for. It takes over the scans
// subscribe counted: the caller does not call scanned for them.
func (s *session) sendRetained(b *Broker, first func(), filters []retainedFor, ids []uint32) {
	s.mu.Lock()
	if first != nil {
		first()
	}
	if s.ended {
		s.mu.Unlock()
		b.retained.scanned(len(filters))
		return
	}
	for _, w := range filters {
		// Subscribing again sends the retained messages again [MQTT-3.3.1-9]:
		// the new scan replaces one still under way.
		s.endScansLocked(w.filter)
		s.scan.list = append(s.scan.list, b.retained.startScan(w, ids))
		s.scan.n.Add(1)
	}
	s.mu.Unlock()
	s.pumpRetained()
}

// endScansLocked ends the session's scans of filter, or all of them when
// filter is empty. The caller holds s.mu.
func (s *session) endScansLocked(filter string) {
	n := 0
	for _, sc := range s.scan.list {
		if filter == "" || sc.filter == filter {
			sc.ended = true
			s.b.retained.scanned(1)
			continue
		}
		s.scan.list[n] = sc
		n++
	}
	clear(s.scan.list[n:])
	s.scan.list = s.scan.list[:n]
	if len(s.scan.list) == 0 {
		s.scan.list = nil
	}
	s.scan.n.Store(int32(n))
}

// pumpRetained moves the session's retained scans on while its client
// has room, one page at a time; it returns once the client has no room,
// or, after a page delivered something, once the client's writer has
// something queued: its next written batch calls pump again. Only one
// pump runs per session; a call while one runs returns at once.
func (s *session) pumpRetained() {
	if s.scan.n.Load() == 0 {
		return
	}
	b := s.b
	s.mu.Lock()
	if s.scan.pumping {
		s.mu.Unlock()
		return
	}
	s.scan.pumping = true
	var fx *effects
	for len(s.scan.list) > 0 && !s.ended {
		sc := s.scan.list[0]
		n, maxBytes := s.scanRoomLocked(sc)
		if n == 0 {
			break
		}
		b.retained.mu.RLock()
		if b.retained.behindLocked(sc) {
			b.retained.rebaseLocked(sc)
		}
		b.retained.mu.RUnlock()
		if fx == nil {
			fx = &effects{}
		}
		var delivered int
		if len(sc.mem) > 0 {
			var taken int
			var behind bool
			delivered, taken, behind = s.deliverScanLocked(sc, sc.mem, false, fx)
			if behind {
				continue // rebased at the top
			}
			if taken == 0 {
				// The next message does not fit yet: the writer has a
				// batch queued, and calls pump once it is written.
				break
			}
			clear(sc.mem[:taken])
			sc.mem = sc.mem[taken:]
			if len(sc.mem) == 0 {
				sc.mem = nil
			}
		} else if sc.fileDone {
			s.endScansOneLocked(sc)
			continue
		} else {
			after := sc.after
			s.mu.Unlock()
			page, last, done, err := b.retained.db.RetainedPage(sc.filter, after, matcher.Matches, n, maxBytes)
			msgs := make([]*message, 0, len(page))
			for i := range page {
				if m, err := messageFromStored(&page[i]); err == nil {
					msgs = append(msgs, m)
				}
			}
			s.mu.Lock()
			if sc.ended {
				continue
			}
			if err != nil {
				b.log.Warn("reading retained messages failed", "client", s.id, "filter", sc.filter, "err", err)
				s.endScansOneLocked(sc)
				continue
			}
			var taken int
			var behind bool
			delivered, taken, behind = s.deliverScanLocked(sc, msgs, true, fx)
			if behind {
				continue // read again once rebased
			}
			if taken == len(msgs) {
				sc.after, sc.fileDone = last, done
			} else if taken == 0 {
				break // as above
			} else {
				// The rest of the page is read again when there is room.
				sc.after = msgs[taken-1].topic
			}
		}
		if delivered > 0 && s.conn != nil && s.conn.queued() > 0 {
			// The writer has a batch to write, and it calls pump once
			// written: the rest of the scan goes on from there, and
			// this goroutine (a reader, maybe) gets back to its client.
			break
		}
	}
	s.scan.pumping = false
	s.mu.Unlock()
	if fx != nil {
		b.commitLazy(fx)
	}
}

// endScansOneLocked ends sc, one of the session's scans. The caller holds
// s.mu.
func (s *session) endScansOneLocked(sc *retainedScan) {
	for i, o := range s.scan.list {
		if o == sc {
			// Delete clears the slot it frees: a stale pointer there
			// would keep the ended scan, and what it holds, for as long
			// as the session lives.
			s.scan.list = slices.Delete(s.scan.list, i, i+1)
			if len(s.scan.list) == 0 {
				s.scan.list = nil
			}
			sc.ended = true
			s.scan.n.Add(-1)
			s.b.retained.scanned(1)
			return
		}
	}
}

// scanRoomLocked returns how many messages, and about how many bytes of
// them, sc may deliver now; zero while the client has no room. The
// caller holds s.mu.
func (s *session) scanRoomLocked(sc *retainedScan) (n, maxBytes int) {
	c := s.conn
	if c == nil {
		return 0, 0
	}
	half := s.b.opts.MaxQueuedBytes / 2
	q := c.queued()
	maxBytes = half - q
	if sc.qos > 0 && (len(s.pending) > 0 || len(s.inflight) >= s.window()) {
		maxBytes = min(maxBytes, half-s.pendingB)
	}
	if maxBytes <= 0 {
		if q > 0 || s.pendingB > 0 {
			return 0, 0
		}
		maxBytes = 1 // one message, whatever its size
	}
	return scanPage, maxBytes
}

// deliverScanLocked delivers msgs in order, as far as the client has room,
// skipping those no longer due; it returns how many it delivered and how
// many it took (delivered or skipped), or, taking none, that sc fell
// behind meanwhile and must rebase first. The caller holds s.mu.
func (s *session) deliverScanLocked(sc *retainedScan, msgs []*message, fromFile bool, fx *effects) (delivered, taken int, behind bool) {
	b := s.b
	half := b.opts.MaxQueuedBytes / 2
	now := time.Now().UnixNano()
	r := &b.retained
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.behindLocked(sc) {
		return 0, 0, true
	}
	for _, m := range msgs {
		c := s.conn
		if c == nil {
			break
		}
		qos := min(m.qos, sc.qos)
		if q := c.queued(); q > 0 && q+m.size > half {
			break
		}
		// A QoS 1/2 message the window has no room for waits in the
		// pending queue, in turn with live ones, within half its budget:
		// a steady live stream cannot starve the scan, nor the scan
		// crowd out the live stream.
		if qos > 0 && (len(s.pending) > 0 || len(s.inflight) >= s.window()) && s.pendingB+m.size > half {
			break
		}
		taken++
		if m.expired(now) || !r.currentLocked(sc, m, fromFile) {
			continue
		}
		// Sent because of a new subscription: retain set [MQTT-3.3.1-8].
		s.deliverLocked(b, delivery{msg: m, qos: qos, retain: true, subIDs: sc.ids}, fx)
		delivered++
	}
	return delivered, taken, false
}

// queued returns the bytes waiting in c's outbound queue or being
// written.
func (c *conn) queued() int {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	return c.queuedB
}

// scanning reports whether the writer, once it has written items, must
// call pump: they hold a message, so the session is known to be attached,
// and it has a retained scan under way.
func (c *conn) scanning(items []outItem) bool {
	for i := range items {
		if items[i].d.msg != nil {
			return c.s.scan.n.Load() > 0
		}
	}
	return false
}
