package broker

import (
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/fieldgate/fieldgate/matcher"
	"github.com/fieldgate/fieldgate/storage"
)

// retainedStore holds the last retained message of every topic in memory.
// A filter without wildcards is a direct lookup; a wildcard filter is
// checked against every retained topic, which is fine for the hundreds a
// gateway holds. The storage package replaces this with a prefix seek.
//
// Retained changes are numbered, and the numbers order them against new
// subscriptions: a retained publish makes its change and matches
// subscribers in one step under mu (see change), and a subscription
// enters the index under mu and takes the latest number (see subscribe).
// A change numbered above a subscription's number was routed to it live,
// one at or below was not; so its scan (retainscan.go) sends a topic's message
// only while the topic's latest change is at or below the number. Each
// message reaches a new subscription once, as the retained copy or live;
// a retained one replaced meanwhile gives way to its replacement.
//
// Lock order: session.mu, then mu, then the index's locks.
type retainedStore struct {
	mu     sync.RWMutex
	seq    uint64                 // the number of the latest change
	topics map[string]retainedMsg // $SYS topics always; every topic without storage

	// recent holds the latest change of each stored topic changed lately,
	// since the file alone cannot answer a scan: it may not have the
	// change yet (the message is kept until it has), and it does not
	// know the change's number (kept while a scan is under way).
	recent map[string]*recentChange
	scans  atomic.Int32 // subscriptions past subscribe whose scanned has not come
	// kept counts the changes in recent the file has, kept for the
	// scans; past keepMax they are forgotten and floor is raised to the
	// latest number, so that a scan stalled for good (its persistent
	// session's client gone) cannot make the log grow with every topic
	// changed since. A scan whose scanTo is below floor rebases itself
	// before it goes on (see rebaseLocked).
	kept    int
	keepMax int
	floor   uint64

	db  *storage.DB
	log *slog.Logger

	bounds   retainedBounds                // guarded by mu; see quota.go
	onRefuse func(kind string, m *message) // counts and logs a refused change
}

// retainedMsg is a retained message held in memory, with its number.
type retainedMsg struct {
	m   *message
	seq uint64
}

// recentChange is a stored topic's latest retained change.
type recentChange struct {
	topic  string   // its key in recent
	m      *message // nil for a delete, and once inFile
	seq    uint64
	inFile bool   // storage has applied it, or failed to: the file's value stands
	asked  uint64 // the seq tidy last asked storage about
	// submitted is the highest seq whose lazily committed batch has gone
	// to storage: once it equals seq, storage.After can tell when the
	// file has the change.
	submitted atomic.Uint64
	// filed is the latest change of the topic storage has applied, which
	// the committer keeps: a stored write applies only if it is later,
	// so that of two publishers' batches handed to storage in the
	// opposite order of their changes, the file keeps the later change.
	filed atomic.Uint64
}

// submit notes that the batch holding change seq has gone to storage.
func (c *recentChange) submit(seq uint64) {
	for {
		cur := c.submitted.Load()
		if cur >= seq || c.submitted.CompareAndSwap(cur, seq) {
			return
		}
	}
}

// stored reports whether topic's retained message lives in storage:
// everything but the broker's own $SYS topics, which are rewritten every
// few seconds and not worth an SD card's wear.
func (r *retainedStore) stored(topic string) bool {
	return r.db != nil && !matcher.IsSys(topic)
}

// recentKeep bounds the changes the file has that the retained store
// keeps while scans are under way: about 250 bytes each with a short
// topic, so 4,096 of them are 1 MB, and a healthy scan of 20,000
// messages takes a few seconds, in which a gateway's retained topics
// change far fewer times than that.
const recentKeep = 4096

func (r *retainedStore) init() {
	r.topics = make(map[string]retainedMsg)
	r.recent = make(map[string]*recentChange)
	r.keepMax = recentKeep
}

// change stores m as its topic's retained message, or clears the topic's
// when m's payload is empty, and calls match, which finds the
// subscriptions m goes to, under the same lock: see retainedStore. A
// stored topic's change goes into fx's batch, and fx notes it for
// commitEffects; without fx it is not stored.
func (r *retainedStore) change(m *message, fx *effects, match func()) {
	del := len(m.payload) == 0 // [MQTT-3.3.1-6] [MQTT-3.3.1-7]
	stored := r.stored(m.topic)
	if stored && fx != nil {
		// Built before taking the lock: it encodes the message.
		if del {
			fx.batch.DeleteRetained(m.topic)
		} else {
			putRetained(&fx.batch, m)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.admit(m, del, fx) {
		match() // refused for the store; delivered live all the same
		return
	}
	r.seq++
	switch {
	case stored && fx == nil:
		// No batch to store it in.
	case stored:
		c := r.recent[m.topic]
		if c == nil {
			// The topic points into the packet's buffer, which must not
			// outlive the message.
			c = &recentChange{topic: strings.Clone(m.topic)}
			r.recent[c.topic] = c
		}
		if c.inFile {
			r.kept--
		}
		c.m, c.seq, c.inFile = m, r.seq, false
		if del {
			c.m = nil
		}
		fx.batch.GuardLast(&c.filed, r.seq) // the write built above
		fx.retained, fx.retainedSeq = c, r.seq
	case del:
		delete(r.topics, m.topic)
	default:
		r.topics[m.topic] = retainedMsg{m, r.seq} // [MQTT-3.3.1-5]
	}
	match()
}

// subscribe calls add, which puts a subscription in the index, ordered
// against retained changes, and returns the number its retained scan
// goes up to. With scan, the subscription counts as scanning until
// scanned is called for it.
func (r *retainedStore) subscribe(scan bool, add func() error) (uint64, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if err := add(); err != nil {
		return 0, err
	}
	if scan {
		r.scans.Add(1)
	}
	return r.seq, nil
}

// scanned ends n scans that subscribe counted.
func (r *retainedStore) scanned(n int) {
	if n > 0 {
		r.scans.Add(int32(-n))
	}
}

func (r *retainedStore) len() int {
	r.mu.RLock()
	n := len(r.topics)
	r.mu.RUnlock()
	if r.db != nil {
		n += r.db.RetainedCount()
	}
	return n
}

// match calls fn for every retained message whose topic filter matches
// and whose topic has changed last at or before change scanTo; newer
// changes went to the subscription live. fn runs without the store's
// lock held.
func (r *retainedStore) match(filter string, scanTo uint64, fn func(*message)) {
	var found []*message
	// held are the stored topics whose change the file may not have yet:
	// their value is the one in recent, not the file's.
	var held map[string]bool
	fromRecent := func(topic string, c *recentChange) {
		if c.inFile {
			return
		}
		if held == nil {
			held = make(map[string]bool)
		}
		held[topic] = true
		if c.m != nil && c.seq <= scanTo {
			found = append(found, c.m)
		}
	}
	r.mu.RLock()
	if !strings.ContainsAny(filter, "+#") {
		if e, ok := r.topics[filter]; ok && e.seq <= scanTo {
			found = append(found, e.m)
		}
		if c := r.recent[filter]; c != nil {
			fromRecent(filter, c)
		}
	} else {
		for t, e := range r.topics {
			if e.seq <= scanTo && matcher.Matches(filter, t) {
				found = append(found, e.m)
			}
		}
		for t, c := range r.recent {
			if matcher.Matches(filter, t) {
				fromRecent(t, c)
			}
		}
	}
	r.mu.RUnlock()
	for _, m := range found {
		fn(m)
	}
	if r.db == nil {
		return
	}
	// The stored ones are read from the file on each subscribe, so the
	// broker holds no second copy of every retained payload.
	var fromFile []*message
	err := r.db.MatchRetained(filter, matcher.Matches, func(sm *storage.Message) {
		if held[sm.Topic] {
			return
		}
		if m, err := messageFromStored(sm); err == nil {
			fromFile = append(fromFile, m)
		}
	})
	if err != nil {
		r.log.Warn("reading retained messages failed", "filter", filter, "err", err)
	}
	// The file may hold a change made since the lock was taken above:
	// numbered above scanTo, it went to the subscription live. Changes at
	// or below scanTo stay in recent while the scan is under way.
	n := 0
	r.mu.RLock()
	for _, m := range fromFile {
		if c := r.recent[m.topic]; c == nil || c.seq <= scanTo {
			fromFile[n] = m
			n++
		}
	}
	r.mu.RUnlock()
	for _, m := range fromFile[:n] {
		fn(m)
	}
}

// applied notes that storage has applied change seq of c, or failed to:
// the file's value stands. A change the file has is forgotten while no
// scan is under way, since a scan that starts later goes up to a number
// above it; else only its message is let go, and tidy forgets it later.
func (r *retainedStore) applied(c *recentChange, seq uint64) {
	r.mu.Lock()
	r.appliedLocked(c, seq)
	r.mu.Unlock()
}

func (r *retainedStore) appliedLocked(c *recentChange, seq uint64) {
	switch {
	case c.seq != seq || c.inFile:
	case r.scans.Load() == 0:
		if r.recent[c.topic] == c {
			delete(r.recent, c.topic)
		}
	default:
		c.m, c.inFile = nil, true
		r.kept++
		if r.kept > r.keepMax {
			r.forgetFiledLocked()
			// Every scan begun before now may have needed what was
			// forgotten: it rebases before it goes on.
			r.floor = r.seq
		}
	}
}

// forgetFiledLocked forgets the changes the file has. The caller holds
// mu for writing.
func (r *retainedStore) forgetFiledLocked() {
	for t, c := range r.recent {
		if c.inFile {
			delete(r.recent, t)
		}
	}
	r.kept = 0
}

// tidy runs about once a second. It forgets the changes the file has
// while no scan is under way, and asks storage to say when the lazily
// committed ones handed to it so far are in the file.
func (r *retainedStore) tidy() {
	if r.db == nil {
		return
	}
	type asked struct {
		c   *recentChange
		seq uint64
	}
	var due []asked
	r.mu.Lock()
	if r.scans.Load() == 0 && r.kept > 0 {
		r.forgetFiledLocked()
	}
	for _, c := range r.recent {
		switch {
		case c.inFile:
		case c.submitted.Load() == c.seq && c.asked != c.seq:
			c.asked = c.seq
			due = append(due, asked{c, c.seq})
		}
	}
	r.mu.Unlock()
	if len(due) == 0 {
		return
	}
	// Batches are applied in the order they come, so this runs once
	// every change in due has been applied, or has failed.
	r.db.After(func(error) {
		r.mu.Lock()
		for _, a := range due {
			r.appliedLocked(a.c, a.seq)
		}
		r.mu.Unlock()
	})
}
