package broker

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fieldgate/fieldgate/internal/check"
	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/matcher"
	"github.com/fieldgate/fieldgate/storage"
)

// Bounds on what clients can make the broker keep after they leave. A
// hostile client on the LAN can otherwise open persistent sessions with
// long filters, or retain large messages on many topics, until the
// gateway runs out of memory (under the unit's MemoryMax) or the SD card
// fills. Each bound refuses growth past it, with the reason code MQTT
// has for it, counts the refusal (Stats.Refusals, and /metrics), and
// logs at most once a minute per kind. Nothing already held is ever
// deleted for a bound: state restored over a bound lowered since it was
// stored is kept, said so in the log, and only new growth is refused
// until it is back under the bound.
//
// The defaults are sized for a 512 MB board under MemoryMax=192M, with
// the state file on an SD card, with every bound reached at once:
//
//   - 1,000 persistent sessions, 250 per user, of up to 16 KiB of filters
//     each (at most broker.max_subscriptions of them, of up to 1 KiB
//     each): 16 MiB of filter bytes at most, which the index, the
//     sessions' maps and the state file each keep once.
//   - 10,000 retained messages and 16 MiB of their bytes, 2,500 and
//     4 MiB per user. They live in the state file, not in memory; what
//     the broker keeps in memory per retained message is its accounting
//     entry, about 40 bytes. A subscription to # reads them all, so the
//     byte bound also bounds what one retained scan can read.
const (
	defaultMaxPersistentSessions        = 1000
	defaultMaxPersistentSessionsPerUser = 250
	defaultMaxFilterBytes               = 1 << 10
	defaultMaxSessionFilterBytes        = 16 << 10
	defaultMaxRetained                  = 10000
	defaultMaxRetainedBytes             = 16 << 20
	defaultMaxRetainedPerUser           = 2500
	defaultMaxRetainedBytesPerUser      = 4 << 20
)

// retainedOverhead is what a retained message counts against the byte
// bounds beyond its topic, properties and payload: its record's header
// and bbolt's keeping of its key and the owner record, so that many empty
// messages count too. Storage counts outbox entries the same way.
const retainedOverhead = 64

// The kinds of refusal, as Stats.Refusals and /metrics name them.
const (
	refusedSessions        = "persistent_sessions"
	refusedSessionsPerUser = "persistent_sessions_per_user"
	refusedSubscriptions   = "subscriptions"
	refusedFilterBytes     = "filter_bytes"
	refusedSessionFilters  = "session_filter_bytes"
	refusedRetained        = "retained"
	refusedRetainedPerUser = "retained_per_user"
)

// refusalKinds lists the kinds in the order metrics show them.
var refusalKinds = [...]string{
	refusedSessions, refusedSessionsPerUser, refusedSubscriptions, refusedFilterBytes,
	refusedSessionFilters, refusedRetained, refusedRetainedPerUser,
}

// checkBounds reports the problems of the bounds' keys to k.
func (c Config) checkBounds(k *check.Checker) {
	k.IntRange("broker.max_persistent_sessions", c.MaxPersistentSessions, 1, 1<<20, "1000")
	k.IntRange("broker.max_persistent_sessions_per_user", c.MaxPersistentSessionsPerUser, 1, 1<<20, "250")
	k.IntRange("broker.max_filter_bytes", c.MaxFilterBytes, 1, mqttwire.MaxTwoByte, "1024")
	k.IntRange("broker.max_session_filter_bytes", c.MaxSessionFilterBytes, 1, 1<<30, "16384")
	k.IntRange("broker.max_retained_messages", c.MaxRetained, 1, 1<<24, "10000")
	k.IntRange("broker.max_retained_bytes", c.MaxRetainedBytes, 1, math.MaxInt32, "16777216")
	k.IntRange("broker.max_retained_messages_per_user", c.MaxRetainedPerUser, 1, 1<<24, "2500")
	k.IntRange("broker.max_retained_bytes_per_user", c.MaxRetainedBytesPerUser, 1, math.MaxInt32, "4194304")
	atMost := func(part, whole string, p, w int) {
		if p <= w || p < 1 || w < 1 { // out of range: said above
			return
		}
		if k.Either(part, whole) == part {
			k.Fail(part, "%d is more than %s (%d), which bounds all of them together; use at most that", p, whole, w)
		} else {
			k.Fail(whole, "%d is less than %s (%d); use at least that", w, part, p)
		}
	}
	atMost("broker.max_persistent_sessions_per_user", "broker.max_persistent_sessions", c.MaxPersistentSessionsPerUser, c.MaxPersistentSessions)
	atMost("broker.max_filter_bytes", "broker.max_session_filter_bytes", c.MaxFilterBytes, c.MaxSessionFilterBytes)
	atMost("broker.max_retained_messages_per_user", "broker.max_retained_messages", c.MaxRetainedPerUser, c.MaxRetained)
	atMost("broker.max_retained_bytes_per_user", "broker.max_retained_bytes", c.MaxRetainedBytesPerUser, c.MaxRetainedBytes)
}

// quota is the broker's accounting of its bounds, beside the retained
// store's (retainedBounds).
type quota struct {
	// Guarded by Broker.mu, as the sessions are.
	persistent int
	byUser     map[string]int
	held       map[string]string // client id → the user its persistent session counts for

	refused [len(refusalKinds)]atomic.Int64
	logged  [len(refusalKinds)]atomic.Int64 // unix seconds of each kind's last log line
}

// errQuota refuses a new persistent session past a bound: CONNACK 0x97
// Quota exceeded in MQTT 5, 0x03 Server unavailable in 3.1.1, which has
// no code closer to "not now, not for you".
var errQuota = errors.New("persistent session limit reached")

// refuse counts a refusal of kind and logs it, at most once a minute per
// kind, so that a flood of refusals cannot fill the journal.
func (b *Broker) refuse(kind string, args ...any) {
	i := 0
	for i < len(refusalKinds) && refusalKinds[i] != kind {
		i++
	}
	n := b.quota.refused[i].Add(1)
	now := time.Now().Unix()
	last := b.quota.logged[i].Load()
	if now-last < 60 || !b.quota.logged[i].CompareAndSwap(last, now) {
		return
	}
	b.log.Warn("refused past a bound", append([]any{"bound", kind, "refused_total", n}, args...)...)
}

// admitSession counts a new persistent session of client id for user,
// or refuses it with errQuota past broker.max_persistent_sessions or
// broker.max_persistent_sessions_per_user. Sessions without an expiry,
// which end with their connection, are not counted. The caller holds
// b.mu and creates the session when it returns nil.
func (b *Broker) admitSession(id, user string, expiry time.Duration) error {
	if expiry <= 0 {
		return nil
	}
	q := &b.quota
	if q.byUser == nil {
		q.byUser, q.held = make(map[string]int), make(map[string]string)
	}
	switch {
	case q.persistent >= b.opts.MaxPersistentSessions:
		b.refuse(refusedSessions, "client", id, "user", user, "limit", b.opts.MaxPersistentSessions)
		return fmt.Errorf("%w: %d persistent sessions are held (broker.max_persistent_sessions)", errQuota, q.persistent)
	case q.byUser[user] >= b.opts.MaxPersistentSessionsPerUser:
		b.refuse(refusedSessionsPerUser, "client", id, "user", user, "limit", b.opts.MaxPersistentSessionsPerUser)
		return fmt.Errorf("%w: user has %d persistent sessions (broker.max_persistent_sessions_per_user)", errQuota, q.byUser[user])
	}
	b.holdSession(id, user)
	return nil
}

// holdSession counts a persistent session; the caller holds b.mu.
func (b *Broker) holdSession(id, user string) {
	q := &b.quota
	if q.byUser == nil {
		q.byUser, q.held = make(map[string]int), make(map[string]string)
	}
	q.persistent++
	q.byUser[user]++
	q.held[id] = user
}

// releaseSession stops counting the session of client id, which has
// ended; the caller holds b.mu.
func (b *Broker) releaseSession(id string) {
	q := &b.quota
	user, ok := q.held[id]
	if !ok {
		return
	}
	delete(q.held, id)
	q.persistent--
	if q.byUser[user]--; q.byUser[user] <= 0 {
		delete(q.byUser, user)
	}
}

// admitFilter reports whether session s may add filter, which it does not
// hold, and the SUBACK code (MQTT 5) when it may not: 0x8F past
// broker.max_filter_bytes (the filter is well formed but not one this
// server accepts), 0x97 past broker.max_subscriptions or
// broker.max_session_filter_bytes. The caller holds s.mu.
func (c *conn) admitFilter(s *session, filter string) (byte, bool) {
	o := &c.b.opts
	if len(filter) > o.MaxFilterBytes {
		c.b.refuse(refusedFilterBytes, "client", c.clientID, "user", c.user, "bytes", len(filter), "limit", o.MaxFilterBytes)
		return rcFilterInvalid, false
	}
	if len(s.subs) >= o.MaxSubscriptions {
		c.b.refuse(refusedSubscriptions, "client", c.clientID, "user", c.user, "limit", o.MaxSubscriptions)
		return rcQuotaExceeded, false
	}
	// At most broker.max_subscriptions filters: summing them is cheaper
	// than keeping a sum on every session.
	n := len(filter)
	for f := range s.subs {
		n += len(f)
	}
	if n > o.MaxSessionFilterBytes {
		c.b.refuse(refusedSessionFilters, "client", c.clientID, "user", c.user, "bytes", n, "limit", o.MaxSessionFilterBytes)
		return rcQuotaExceeded, false
	}
	return 0, true
}

// retainedBounds counts the retained messages clients have set, in all
// and per user, against broker.max_retained_*. It is guarded by
// retainedStore.mu, so that its order of changes is the store's: a
// change is admitted, and counted, in the same step that numbers it.
//
// Entries are keyed by a 64-bit hash of the topic rather than the topic:
// the broker then holds no copy of the topics, which can be 64 KiB each.
// Two topics of one store sharing a hash (about 1 in 10^11 for 10,000
// topics) would be counted as one: the bounds would be off by one
// message, nothing would be lost.
type retainedBounds struct {
	max          boundsLimits
	seed         maphash.Seed
	entries      map[uint64]retainedEntry
	count, bytes int
	// users holds the accounts by id, 0 unused; ids of accounts that
	// went to zero are reused, so attackers claiming names leave none.
	users  []retainedUser
	byName map[string]uint32
	free   []uint32
}

// boundsLimits are the retained bounds, from Config.
type boundsLimits struct {
	count, bytes, userCount, userBytes int
}

// retainedEntry is what one retained message counts, and for whom: user
// is 0 for the gateway's own messages and those restored without an
// owner, which count towards the totals only. 8 bytes, so that with its
// key an entry costs about 40 bytes of map (measured by
// TestRetainedHeapPerMessage); a retained message is at most
// broker.max_packet_size, far below 4 GiB.
type retainedEntry struct {
	user uint32
	size uint32
}

// retainedUser is what one user's retained messages count.
type retainedUser struct {
	name         string
	count, bytes int
}

func (q *retainedBounds) init(c Config) {
	q.max = boundsLimits{c.MaxRetained, c.MaxRetainedBytes, c.MaxRetainedPerUser, c.MaxRetainedBytesPerUser}
	q.seed = maphash.MakeSeed()
	q.entries = make(map[uint64]retainedEntry)
	q.users = make([]retainedUser, 1)
	q.byName = make(map[string]uint32)
}

// accounted reports whether a retained change of m counts against the
// bounds: not the broker's own $SYS topics, and not a change the store
// does not keep (a stored topic's change without a batch). Clients' $
// topics, such as $aws/things/..., count like any other.
func (r *retainedStore) accounted(m *message, fx *effects) bool {
	return !matcher.IsSys(m.topic) && (r.db == nil || fx != nil)
}

// putRetained adds m's retained write to bt, with its owner: none for the
// gateway's own messages.
func putRetained(bt *storage.Batch, m *message) {
	if m.local {
		bt.SetRetained(storedMessage(m))
	} else {
		bt.SetRetainedBy(storedMessage(m), m.owner)
	}
}

// admit counts the retained change m, and reports false when it must be
// refused: it would take the store past a bound, counting what it adds
// net of the message it replaces. Deleting, and replacing with no more
// than the replaced message held, always succeed, even over a bound; the
// gateway's own messages are counted but never refused. A refused change
// has its write (the last one in fx's batch) taken back, and fx notes the
// refusal for the publisher's acknowledgement. The caller holds
// retainedStore.mu.
func (r *retainedStore) admit(m *message, del bool, fx *effects) bool {
	if !r.accounted(m, fx) {
		return true
	}
	q := &r.bounds
	key := maphash.String(q.seed, m.topic)
	old, had := q.entries[key]
	if del {
		if had {
			q.remove(key, old)
		}
		return true
	}
	size := (m.size-queuedCost(0))/2 + retainedOverhead // its topic, payload and properties
	var id uint32
	if !m.local {
		id = q.user(m.owner)
	}
	grow := size
	if had {
		grow -= int(old.size)
	}
	userGrow, userNew := size, !had || old.user != id
	if !userNew {
		userGrow -= int(old.size)
	}
	if !m.local {
		u := &q.users[id]
		var kind string
		switch {
		case (!had && q.count >= q.max.count) || (grow > 0 && q.bytes+grow > q.max.bytes):
			kind = refusedRetained
		case (userNew && u.count >= q.max.userCount) || (userGrow > 0 && u.bytes+userGrow > q.max.userBytes):
			kind = refusedRetainedPerUser
		}
		if kind != "" {
			q.release(id)
			if fx != nil {
				if r.stored(m.topic) {
					fx.batch.DropLast()
				}
				fx.retainRefused = true
			}
			r.refuse(kind, m)
			return false
		}
	}
	if had {
		q.remove(key, old)
	}
	q.add(key, id, size)
	return true
}

// user returns the id of name's account, making it.
func (q *retainedBounds) user(name string) uint32 {
	if id, ok := q.byName[name]; ok {
		return id
	}
	u := retainedUser{name: strings.Clone(name)}
	var id uint32
	if n := len(q.free); n > 0 {
		id = q.free[n-1]
		q.free = q.free[:n-1]
		q.users[id] = u
	} else {
		id = uint32(len(q.users))
		q.users = append(q.users, u)
	}
	q.byName[u.name] = id
	return id
}

// release lets account id go once it counts nothing.
func (q *retainedBounds) release(id uint32) {
	if id == 0 || q.users[id].count > 0 {
		return
	}
	delete(q.byName, q.users[id].name)
	q.users[id] = retainedUser{}
	q.free = append(q.free, id)
}

func (q *retainedBounds) add(key uint64, id uint32, size int) {
	q.entries[key] = retainedEntry{user: id, size: uint32(size)}
	q.count++
	q.bytes += size
	if id != 0 {
		q.users[id].count++
		q.users[id].bytes += size
	}
}

func (q *retainedBounds) remove(key uint64, e retainedEntry) {
	delete(q.entries, key)
	q.count--
	q.bytes -= int(e.size)
	if e.user != 0 {
		q.users[e.user].count--
		q.users[e.user].bytes -= int(e.size)
		q.release(e.user)
	}
}

// load counts the retained messages of the state file, at start. Those
// stored without an owner count towards the totals only.
func (q *retainedBounds) load(db *storage.DB) error {
	return db.RetainedEntries(func(e storage.RetainedEntry) {
		var id uint32
		if e.Owned {
			id = q.user(e.User)
		}
		q.add(maphash.String(q.seed, e.Topic), id, e.Bytes+retainedOverhead)
	})
}

// refuse counts and logs a refused retained change; set by the broker.
func (r *retainedStore) refuse(kind string, m *message) {
	if r.onRefuse != nil {
		r.onRefuse(kind, m)
	}
}

// restoreBounds counts what the state file holds against the bounds, at
// start, after restore: the persistent sessions and the retained
// messages. What is over a bound lowered since is kept and said so.
func (b *Broker) restoreBounds() error {
	b.retained.bounds.init(b.opts.Config)
	b.retained.onRefuse = func(kind string, m *message) {
		b.refuse(kind, "topic", m.topic, "user", m.owner, "bytes", len(m.payload))
	}
	for id, s := range b.sessions {
		if s.expiry > 0 {
			b.holdSession(id, s.user)
		}
	}
	q := &b.quota
	if q.persistent > b.opts.MaxPersistentSessions {
		b.log.Warn("restored persistent sessions are over broker.max_persistent_sessions; all kept, new ones refused until fewer",
			"sessions", q.persistent, "limit", b.opts.MaxPersistentSessions)
	}
	for user, n := range q.byUser {
		if n > b.opts.MaxPersistentSessionsPerUser {
			b.log.Warn("a user's restored persistent sessions are over broker.max_persistent_sessions_per_user; all kept, new ones refused until fewer",
				"user", user, "sessions", n, "limit", b.opts.MaxPersistentSessionsPerUser)
		}
	}
	if b.store == nil {
		return nil
	}
	rb := &b.retained.bounds
	if err := rb.load(b.store); err != nil {
		return fmt.Errorf("broker: counting retained messages in %s: %w", b.store.Path(), err)
	}
	if rb.count > rb.max.count || rb.bytes > rb.max.bytes {
		b.log.Warn("restored retained messages are over broker.max_retained_messages or max_retained_bytes; all kept, new ones refused until under",
			"messages", rb.count, "bytes", rb.bytes, "limit_messages", rb.max.count, "limit_bytes", rb.max.bytes)
	}
	for _, u := range rb.users[1:] {
		if u.count > 0 && u.count > rb.max.userCount || u.bytes > rb.max.userBytes {
			b.log.Warn("a user's restored retained messages are over broker.max_retained_*_per_user; all kept, new ones refused until under",
				"user", u.name, "messages", u.count, "bytes", u.bytes)
		}
	}
	return nil
}

// boundStats are the bounds' figures for Stats.
func (b *Broker) boundStats(st *Stats) {
	b.mu.Lock()
	st.PersistentSessions = b.quota.persistent
	b.mu.Unlock()
	b.retained.mu.RLock()
	st.RetainedBytes = int64(b.retained.bounds.bytes)
	st.RetainedCounted = b.retained.bounds.count
	b.retained.mu.RUnlock()
	st.Refusals = make(map[string]int64, len(refusalKinds))
	for i, kind := range refusalKinds {
		st.Refusals[kind] = b.quota.refused[i].Load()
	}
}
