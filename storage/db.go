package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Buckets. Every session record is keyed by client id, or prefixed by
// client id and 0x00; the outbox bucket holds one bucket per bridge.
var (
	bucketMeta     = []byte("meta")
	bucketRetained = []byte("retained") // topic → message record
	bucketSessions = []byte("sessions") // client id → session record
	bucketSubs     = []byte("subs")     // client id, 0, filter → options byte, identifier
	bucketQueue    = []byte("queue")    // client id, 0, sequence → queue record
	bucketRel      = []byte("rel")      // client id, 0, packet id → empty
	bucketOutbox   = []byte("outbox")   // bridge name → bucket: sequence → outbox record
	bucketUpflight = []byte("upflight") // bridge name → bucket: sequence → QoS 2 flight record
	// topic → 'u' and the user name of whoever set its retained message;
	// none for the gateway's own messages and those of schema 4 and older.
	bucketRetainedBy = []byte("retainedby")
	bucketDeadLetter = []byte("deadletter") // bridge name → bucket: dead-letter sequence → dead letter

	allBuckets = [][]byte{bucketMeta, bucketRetained, bucketSessions, bucketSubs, bucketQueue, bucketRel, bucketOutbox, bucketUpflight, bucketRetainedBy, bucketDeadLetter}

	keySchema = []byte("schema")
)

// SchemaVersion is the layout this build writes. Files of older versions
// are migrated at Open; newer ones are refused.
const SchemaVersion = 6

// Errors Open and the commit functions return.
var (
	ErrNewerSchema = errors.New("storage: database written by a newer fieldgate")
	ErrClosed      = errors.New("storage: closed")
)

// Options tunes a DB; the zero value is usable.
type Options struct {
	Logger *slog.Logger
	// LazyDelay is how long writes that need no fsync of their own (QoS 0
	// retained messages) may wait for a durable commit to ride with.
	LazyDelay time.Duration
	// LockTimeout bounds the wait for another process holding the file.
	LockTimeout time.Duration
}

// DB is the open state file.
type DB struct {
	bolt      *bolt.DB
	path      string
	log       *slog.Logger
	lazyDelay time.Duration

	qmu     sync.Mutex
	queue   []pending
	spare   []pending
	durable int
	closed  bool

	wake     chan struct{}
	stop     chan struct{}
	loopDone chan struct{}

	// early holds the queue and outbox records whose delete, or packet
	// identifier patch, reached the file before the record did; only the
	// committer uses it. See earlyWrite.
	early      map[string]*earlyWrite
	earlyKey   []byte // scratch for early's keys
	earlySwept time.Time
	undo       []undo // what the transaction under way changed in early and in write guards

	queuedBytes atomic.Int64
	stats       counters
	lastErr     atomic.Pointer[error] // the last transaction's error; nil once one succeeds
	errLog      atomic.Int64          // unix seconds of the last commit-failure log line
}

// counters are what Stats reports about commits.
type counters struct {
	commits, batches, failures, lazyLost atomic.Int64
	commitNanos                          atomic.Int64
}

// Open opens (creating if needed) the state file at path, migrates an
// older schema, and starts the committer. The directory is created with
// mode 0750 when missing. A file whose page structure is damaged is
// refused with an error that says so, before bbolt reads it.
func Open(path string, opts Options) (*DB, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.LazyDelay <= 0 {
		opts.LazyDelay = time.Second
	}
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = 5 * time.Second
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	bdb, err := openBolt(path, opts.LockTimeout)
	if err != nil {
		return nil, err
	}
	db := &DB{
		bolt: bdb, path: path, log: opts.Logger, lazyDelay: opts.LazyDelay,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), loopDone: make(chan struct{}),
	}
	if err := db.prepare(); err != nil {
		bdb.Close()
		return nil, err
	}
	go db.commitLoop()
	return db, nil
}

// OpenReadOnly opens an existing state file for reading only (Check,
// Stats, Load), without migrating it or starting a committer. It fails
// while a running gateway holds the file.
func OpenReadOnly(path string) (*DB, error) {
	if err := checkPath(path); err != nil {
		return nil, err
	}
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	bdb, err := openBoltMode(path, time.Second, true)
	if err != nil {
		return nil, err
	}
	db := &DB{bolt: bdb, path: path, log: slog.New(slog.DiscardHandler), closed: true, loopDone: make(chan struct{})}
	close(db.loopDone)
	return db, nil
}

// openBolt opens the file, turning bbolt's panics on a damaged file into
// errors: a bad file must never take the gateway down in a loop.
func openBolt(path string, timeout time.Duration) (*bolt.DB, error) {
	return openBoltMode(path, timeout, false)
}

// minFileSize is the smallest file bbolt writes: two meta pages, a
// freelist page and an empty root leaf, of at least 4 KiB each. A shorter
// file that is not empty lost its tail, and bbolt would read the missing
// pages through its memory map.
const minFileSize = 4 * 4096

func openBoltMode(path string, timeout time.Duration, readOnly bool) (*bolt.DB, error) {
	if err := checkPath(path); err != nil {
		return nil, err
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Size() == 0 {
		return boltOpen(path, timeout, readOnly) // new: bbolt writes it
	}
	if fi.Size() < minFileSize {
		return nil, damaged(path, fmt.Errorf("truncated to %d bytes", fi.Size()))
	}
	// A writable open reads the whole freelist at once, and everything
	// after it trusts the page structure: verify that first, under
	// bbolt's shared lock, so that no writer is halfway through a commit.
	ro, err := boltOpen(path, timeout, true)
	if err != nil {
		return nil, err
	}
	if err := verifyFile(path, ro.Info().PageSize); err != nil {
		ro.Close()
		return nil, damaged(path, err)
	}
	if readOnly {
		return ro, nil
	}
	ro.Close()
	return boltOpen(path, timeout, false)
}

// checkPath refuses a state path that names a directory, or a symbolic
// link whose target does not exist: opening it would create the target
// wherever the link points, outside what the configuration names. A link
// to an existing file is followed.
func checkPath(path string) error {
	li, err := os.Lstat(path)
	if err != nil {
		return nil // missing: a new file is made
	}
	fi := li
	if li.Mode()&os.ModeSymlink != 0 {
		target, _ := os.Readlink(path)
		if fi, err = os.Stat(path); err != nil {
			return fmt.Errorf("storage: %s is a symbolic link to %s, which does not exist (%v); create the state file there, remove the link, or set storage.path to a file", path, target, err)
		}
	}
	if fi.IsDir() {
		return fmt.Errorf("storage: %s is a directory, not a state file; set storage.path to a file, such as %s", path, filepath.Join(path, "state.db"))
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("storage: %s is not a regular file (%s); set storage.path to a file", path, fi.Mode().Type())
	}
	return nil
}

// boltOpen is bolt.Open with its panics and faults, and its errors, made
// ours.
func boltOpen(path string, timeout time.Duration, readOnly bool) (db *bolt.DB, err error) {
	err = guard("open", func() (err error) {
		db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: timeout, ReadOnly: readOnly})
		return err
	})
	switch {
	case err == nil:
		return db, nil
	case errors.Is(err, ErrCorrupt):
		return nil, damaged(path, err)
	case errors.Is(err, berrors.ErrTimeout):
		return nil, lockedError{path}
	}
	return nil, fmt.Errorf("storage: open %s: %w; if the file is damaged, move it aside to start with an empty state", path, err)
}

// ErrLocked is what Open and OpenReadOnly wrap when another process, a
// running gateway, holds the file past the lock timeout.
var ErrLocked = errors.New("storage: locked by another process")

// lockedError names the file another process holds.
type lockedError struct{ path string }

func (e lockedError) Error() string {
	return fmt.Sprintf("storage: %s is locked by another process (is another fieldgate running?)", e.path)
}

func (e lockedError) Is(target error) bool { return target == ErrLocked }

func damaged(path string, err error) error {
	return fmt.Errorf("storage: %s is damaged (%v); move it aside to start with an empty state, or check it with fieldgate db check", path, err)
}

// guard runs fn and turns a panic into an error wrapping ErrCorrupt. bbolt
// panics on a page it cannot make sense of, and a damaged page id can send
// it past the end of the memory-mapped file, a fault that would otherwise
// kill the process; SetPanicOnFault makes that a panic too, for this
// goroutine while fn runs.
func guard(what string, fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: damaged page (%v)", ErrCorrupt, what, r)
		}
	}()
	return fn()
}

// prepare creates the buckets of a new file, or checks and migrates the
// schema of an existing one.
func (db *DB) prepare() error {
	err := guard("open", db.prepareTx)
	if err != nil && errors.Is(err, ErrCorrupt) {
		return fmt.Errorf("storage: %s is damaged (%w); move it aside to start with an empty state", db.path, err)
	}
	return err
}

func (db *DB) prepareTx() error {
	return db.bolt.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		version := uint32(0)
		if meta != nil {
			v := meta.Get(keySchema)
			if len(v) != 4 {
				return fmt.Errorf("storage: %s: no schema version in its meta bucket; it was not written by fieldgate", db.path)
			}
			version = binary.BigEndian.Uint32(v)
		} else if len(bucketNames(tx)) > 0 {
			return fmt.Errorf("storage: %s holds buckets %s but no meta bucket; it was not written by fieldgate", db.path, strings.Join(bucketNames(tx), ", "))
		}
		switch {
		case version > SchemaVersion:
			return fmt.Errorf("%w: %s has schema %d, this build knows up to %d; run the newer fieldgate, or move the file aside to start empty", ErrNewerSchema, db.path, version, SchemaVersion)
		case version == 0:
			for _, b := range allBuckets {
				if _, err := tx.CreateBucketIfNotExists(b); err != nil {
					return fmt.Errorf("storage: create bucket %s: %w", b, err)
				}
			}
		default:
			for v := int(version); v < SchemaVersion; v++ {
				migrate, ok := migrations[v]
				if !ok {
					return fmt.Errorf("storage: %s has schema %d, which no fieldgate release wrote; move it aside to start empty", db.path, v)
				}
				if err := migrate(tx); err != nil {
					return fmt.Errorf("storage: migrate %s from schema %d to %d: %w", db.path, v, v+1, err)
				}
				db.log.Info("state database migrated", "path", db.path, "from", v, "to", v+1)
			}
		}
		for _, b := range allBuckets {
			if tx.Bucket(b) == nil {
				return fmt.Errorf("storage: %s lacks bucket %s", db.path, b)
			}
		}
		var n int64
		_ = tx.Bucket(bucketQueue).ForEach(func(_, v []byte) error { n += int64(len(v)); return nil })
		db.queuedBytes.Store(n)
		return tx.Bucket(bucketMeta).Put(keySchema, binary.BigEndian.AppendUint32(nil, SchemaVersion))
	})
}

func bucketNames(tx *bolt.Tx) []string {
	var names []string
	_ = tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
		names = append(names, string(name))
		return nil
	})
	return names
}

// migrations[v] turns schema v into v+1, inside the opening transaction.
var migrations = map[int]func(*bolt.Tx) error{
	1: migrate1to2,
	2: migrate2to3,
	3: migrate3to4,
	4: migrate4to5,
	5: migrate5to6,
}

// migrate1to2: schema 1 stored retained messages without their MQTT 5
// properties and had no bucket for inbound QoS 2 identifiers.
func migrate1to2(tx *bolt.Tx) error {
	rb := tx.Bucket(bucketRetained)
	if rb == nil {
		return errors.New("no retained bucket")
	}
	type kv struct{ k, v []byte }
	var rewrites []kv
	err := rb.ForEach(func(k, v []byte) error {
		// Schema 1: flags, expiry (8 bytes), payload.
		if len(v) < 9 {
			return corrupt("schema 1 retained message", k)
		}
		m := Message{Topic: string(k), QoS: v[0] & 3, Retain: true, Expiry: int64(binary.BigEndian.Uint64(v[1:9])), Payload: v[9:]}
		rewrites = append(rewrites, kv{bytes.Clone(k), appendMessage(nil, &m)})
		return nil
	})
	if err != nil {
		return err
	}
	for _, r := range rewrites {
		if err := rb.Put(r.k, r.v); err != nil {
			return err
		}
	}
	_, err = tx.CreateBucketIfNotExists(bucketRel)
	return err
}

// migrate2to3: schema 2 had no bridge outboxes.
func migrate2to3(tx *bolt.Tx) error {
	_, err := tx.CreateBucketIfNotExists(bucketOutbox)
	return err
}

// migrate3to4: schema 3 kept no record of the QoS 2 messages in flight
// upstream; its bridges started a clean session after a restart.
func migrate3to4(tx *bolt.Tx) error {
	_, err := tx.CreateBucketIfNotExists(bucketUpflight)
	return err
}

// migrate4to5: schema 4 did not record who set each retained message.
// Its messages keep no owner: they count towards the broker's bounds on
// all retained messages, and towards no user's.
func migrate4to5(tx *bolt.Tx) error {
	_, err := tx.CreateBucketIfNotExists(bucketRetainedBy)
	return err
}

// migrate5to6: schema 5 had no dead letters; its bridges retried a
// message the upstream refused for as long as it was queued. An older
// build refuses the file once it holds schema 6, rather than leave dead
// letters nobody counts or can retry.
func migrate5to6(tx *bolt.Tx) error {
	_, err := tx.CreateBucketIfNotExists(bucketDeadLetter)
	return err
}

// Close commits what is waiting and closes the file.
func (db *DB) Close() error {
	db.qmu.Lock()
	if db.closed {
		db.qmu.Unlock()
		if db.stop == nil && db.bolt != nil {
			// Read-only: no committer to stop.
			b := db.bolt
			db.bolt = nil
			return b.Close()
		}
		return nil
	}
	db.closed = true
	db.qmu.Unlock()
	close(db.stop)
	<-db.loopDone
	return db.bolt.Close()
}

// Path returns the file's path.
func (db *DB) Path() string { return db.path }

// QueuedBytes returns the bytes of queued messages on disk, all sessions.
func (db *DB) QueuedBytes() int64 { return db.queuedBytes.Load() }

func (db *DB) noteCommit(batches int, took time.Duration, err error) {
	db.stats.commits.Add(1)
	db.stats.batches.Add(int64(batches))
	db.stats.commitNanos.Add(int64(took))
	if err == nil {
		db.lastErr.Store(nil)
		return
	}
	db.lastErr.Store(&err)
	db.stats.failures.Add(1)
	db.logError("state database write failed; refusing what cannot be stored until it works again", err)
}

// logError logs a write failure at most once a minute: a full disk, or a
// client that keeps sending what cannot be stored, must not fill the
// journal on the same SD card.
func (db *DB) logError(msg string, err error) {
	now := time.Now().Unix()
	if last := db.errLog.Load(); now-last >= 60 && db.errLog.CompareAndSwap(last, now) {
		db.log.Error(msg, "path", db.path, "err", err)
	}
}

// WriteError returns the error of the last transaction when it failed, as
// on a full disk, and nil once one has succeeded: while it is not nil,
// what must be stored is being refused.
func (db *DB) WriteError() error {
	if e := db.lastErr.Load(); e != nil {
		return *e
	}
	return nil
}

// CommitStats are the committer's counters.
type CommitStats struct {
	Commits  int64         // transactions, each one fsync
	Batches  int64         // batches they carried
	Failures int64         // transactions that failed
	LazyLost int64         // lazy batches lost to failures
	Time     time.Duration // total time spent committing
}

// CommitStats returns the committer's counters.
func (db *DB) CommitStats() CommitStats {
	return CommitStats{
		Commits: db.stats.commits.Load(), Batches: db.stats.batches.Load(),
		Failures: db.stats.failures.Load(), LazyLost: db.stats.lazyLost.Load(),
		Time: time.Duration(db.stats.commitNanos.Load()),
	}
}

// Retained returns the retained message of topic, or nil.
func (db *DB) Retained(topic string) (*Message, error) {
	var m *Message
	err := guard("retained", func() error {
		return db.bolt.View(func(tx *bolt.Tx) error {
			v := tx.Bucket(bucketRetained).Get([]byte(topic))
			if v == nil {
				return nil
			}
			msg, ok := decodeMessage(v)
			if !ok {
				return corrupt("retained message", []byte(topic))
			}
			m = &msg
			return nil
		})
	})
	return m, err
}

// MatchRetained calls fn for every retained message whose topic matches
// filter, as decided by matches. A filter without wildcards is one get;
// otherwise a cursor seeks to the filter's literal prefix (up to its first
// wildcard) and walks the topics that share it, so a subscription to
// plant/greenhouse-1/# reads only that part of the bucket, plus the topic
// plant/greenhouse-1 itself, which the '#' also matches [MQTT-4.7.1-1].
// fn runs after the read transaction has ended.
func (db *DB) MatchRetained(filter string, matches func(filter, topic string) bool, fn func(*Message)) error {
	var found []Message
	err := guard("retained lookup", func() error {
		return db.bolt.View(func(tx *bolt.Tx) error {
			bk := tx.Bucket(bucketRetained)
			add := func(k, v []byte) error {
				m, ok := decodeMessage(v)
				if !ok {
					return corrupt("retained message", k)
				}
				found = append(found, m)
				return nil
			}
			cut := strings.IndexAny(filter, "+#")
			if cut < 0 {
				if v := bk.Get([]byte(filter)); v != nil {
					return add([]byte(filter), v)
				}
				return nil
			}
			// The parent sorts before every topic under the prefix, so the
			// results stay in topic order.
			if filter[cut] == '#' && cut > 0 {
				parent := []byte(filter[:cut-1])
				if v := bk.Get(parent); v != nil && matches(filter, string(parent)) {
					if err := add(parent, v); err != nil {
						return err
					}
				}
			}
			prefix := []byte(filter[:cut])
			c := bk.Cursor()
			for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
				if !matches(filter, string(k)) {
					continue
				}
				if err := add(k, v); err != nil {
					return err
				}
			}
			return nil
		})
	})
	for i := range found {
		fn(&found[i])
	}
	return err
}

// RetainedEntry is one retained message as RetainedEntries reports it:
// what it costs and who set it.
type RetainedEntry struct {
	Topic string
	User  string // who set it, when Owned
	Owned bool   // false for the gateway's own messages, and those a schema 4 file kept
	Bytes int    // its topic, properties and payload
}

// RetainedEntries calls fn for every retained message, in topic order,
// inside one read transaction; it reads the records' lengths, not their
// payloads. The broker counts its retained bounds from it at start.
func (db *DB) RetainedEntries(fn func(RetainedEntry)) error {
	return guard("retained entries", func() error {
		return db.bolt.View(func(tx *bolt.Tx) error {
			owners := tx.Bucket(bucketRetainedBy)
			return tx.Bucket(bucketRetained).ForEach(func(k, v []byte) error {
				p, ok := splitMessage(v)
				if !ok {
					return corrupt("retained message", k)
				}
				e := RetainedEntry{Topic: string(k), Bytes: len(p.topic) + len(p.props) + len(p.payload)}
				if o := owners.Get(k); len(o) > 0 && o[0] == 'u' {
					e.User, e.Owned = string(o[1:]), true
				}
				fn(e)
				return nil
			})
		})
	})
}

// retainedPageKeys bounds the keys one RetainedPage examines, matching
// or not: a filter such as +/temp that matches few of many topics still
// reads the bucket in short transactions, each a few milliseconds on a
// Pi, so that a long scan never holds a read transaction (and with it
// the file's remapping, which a growing file's commit waits for) for long.
const retainedPageKeys = 1024

// RetainedPage reads the next page of the retained messages whose topic
// matches filter (as decided by matches), in topic order: those after
// topic after, or from the first when after is empty (no topic is
// empty). A page ends after maxN messages, or once it holds maxBytes of
// records (it holds at least one message), or after retainedPageKeys
// keys; each page is one short read transaction. It returns the page,
// the last topic it examined, from which the next page goes on, and
// whether no topic the filter can match remains after it. A filter
// without wildcards is one get.
func (db *DB) RetainedPage(filter, after string, matches func(filter, topic string) bool, maxN, maxBytes int) (page []Message, last string, done bool, err error) {
	last = after
	err = guard("retained page", func() error {
		return db.bolt.View(func(tx *bolt.Tx) error {
			bk := tx.Bucket(bucketRetained)
			cut := strings.IndexAny(filter, "+#")
			if cut < 0 {
				done = true
				if after != "" {
					return nil
				}
				last = filter
				if v := bk.Get([]byte(filter)); v != nil {
					m, ok := decodeMessage(v)
					if !ok {
						return corrupt("retained message", []byte(filter))
					}
					page = append(page, m)
				}
				return nil
			}
			// Every topic the filter matches begins with its literal
			// prefix; for a/b/# that is a/b, so that the parent topic
			// a/b, which the '#' matches too [MQTT-4.7.1-1], comes
			// first in the same walk.
			prefix := []byte(filter[:cut])
			if filter[cut] == '#' && cut > 0 {
				prefix = prefix[:cut-1]
			}
			c := bk.Cursor()
			var k, v []byte
			if after == "" {
				k, v = c.Seek(prefix)
			} else if k, v = c.Seek([]byte(after)); k != nil && string(k) == after {
				k, v = c.Next()
			}
			bytesIn := 0
			for n := 0; ; n++ {
				if k == nil || !bytes.HasPrefix(k, prefix) {
					done = true
					return nil
				}
				if n == retainedPageKeys || len(page) == maxN || (len(page) > 0 && bytesIn+len(v) > maxBytes) {
					return nil
				}
				last = string(k)
				if matches(filter, last) {
					m, ok := decodeMessage(v)
					if !ok {
						return corrupt("retained message", k)
					}
					page = append(page, m)
					bytesIn += len(v)
				}
				k, v = c.Next()
			}
		})
	})
	return page, last, done, err
}

// RetainedCount returns the number of retained messages.
func (db *DB) RetainedCount() int {
	n := 0
	_ = guard("retained count", func() error {
		return db.bolt.View(func(tx *bolt.Tx) error {
			n = tx.Bucket(bucketRetained).Stats().KeyN
			return nil
		})
	})
	return n
}

// Load calls fn for every stored session with its subscriptions, queue
// and awaiting identifiers, in client id order. fn runs inside the read
// transaction.
func (db *DB) Load(fn func(*SessionState) error) error {
	// A panic of fn's own is fn's, not a damaged page: carry it past guard.
	var fnPanic any
	errPanicked := errors.New("panicked")
	call := func(st *SessionState) (err error) {
		defer func() {
			if r := recover(); r != nil {
				fnPanic, err = r, errPanicked
			}
		}()
		return fn(st)
	}
	err := guard("load", func() error { return db.load(call) })
	if fnPanic != nil {
		panic(fnPanic)
	}
	return err
}

func (db *DB) load(fn func(*SessionState) error) error {
	return db.bolt.View(func(tx *bolt.Tx) error {
		subs, queue, rel := tx.Bucket(bucketSubs).Cursor(), tx.Bucket(bucketQueue).Cursor(), tx.Bucket(bucketRel).Cursor()
		return tx.Bucket(bucketSessions).ForEach(func(k, v []byte) error {
			sess, ok := decodeSession(string(k), v)
			if !ok {
				return corrupt("session", k)
			}
			st := &SessionState{Session: sess}
			p := sessionPrefix(sess.ClientID)
			for ck, cv := subs.Seek(p); ck != nil && bytes.HasPrefix(ck, p); ck, cv = subs.Next() {
				if len(cv) != 5 {
					return corrupt("subscription", ck)
				}
				st.Subs = append(st.Subs, Sub{Filter: string(ck[len(p):]), Opts: cv[0], ID: binary.BigEndian.Uint32(cv[1:])})
			}
			for ck, cv := queue.Seek(p); ck != nil && bytes.HasPrefix(ck, p); ck, cv = queue.Next() {
				if len(ck) != len(p)+8 {
					return corrupt("queue key", ck)
				}
				q, ok := decodeQueued(binary.BigEndian.Uint64(ck[len(p):]), cv)
				if !ok {
					return corrupt("queued message", ck)
				}
				st.Queue = append(st.Queue, q)
			}
			for ck, _ := rel.Seek(p); ck != nil && bytes.HasPrefix(ck, p); ck, _ = rel.Next() {
				if len(ck) != len(p)+2 {
					return corrupt("awaiting PUBREL key", ck)
				}
				st.AwaitingRel = append(st.AwaitingRel, binary.BigEndian.Uint16(ck[len(p):]))
			}
			return fn(st)
		})
	})
}
