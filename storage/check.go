package storage

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sort"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// Check verifies the file: bbolt's own page consistency, then fieldgate's
// invariants (every record decodes, every subscription, queued message and
// awaiting identifier belongs to a stored session, in-flight packet
// identifiers are unique per session, every outbox is a bucket of entries
// keyed by a sequence from 1, every QoS 2 flight record and dead letter
// decodes). It returns every problem found;
// none means the file is sound.
func (db *DB) Check() []string {
	var problems []string
	add := func(format string, args ...any) {
		if len(problems) < 100 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	// bbolt's checker reads the freelist, which a commit changes under a
	// read transaction: on a writable file, Check holds the writer lock
	// instead, and commits wait for it.
	view := db.bolt.View
	if !db.bolt.IsReadOnly() {
		view = func(fn func(*bolt.Tx) error) error {
			tx, err := db.bolt.Begin(true)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			return fn(tx)
		}
	}
	err := guard("check", func() error {
		return view(func(tx *bolt.Tx) error {
			// bbolt's checker runs in a goroutine of its own, where a
			// damaged page would end the process: it gets only a file
			// whose structure is sound.
			if err := verifyFile(db.path, db.bolt.Info().PageSize); err != nil {
				add("pages: %v", err)
				return nil
			}
			for err := range tx.Check(bolt.WithKVStringer(shortKeys{})) {
				add("bbolt: %v", err)
			}
			each := func(name []byte, fn func(k, v []byte) error) {
				if b := tx.Bucket(name); b != nil {
					_ = b.ForEach(fn)
				} else {
					add("bucket %s is missing", name)
				}
			}
			if meta := tx.Bucket(bucketMeta); meta == nil {
				add("bucket %s is missing", bucketMeta)
			} else if v := meta.Get(keySchema); len(v) != 4 || binary.BigEndian.Uint32(v) != SchemaVersion {
				add("meta: schema version %x, want %d", v, SchemaVersion)
			}
			sessions := map[string]bool{}
			each(bucketSessions, func(k, v []byte) error {
				if _, ok := decodeSession(string(k), v); !ok {
					add("sessions: record of %q does not decode", k)
				}
				sessions[string(k)] = true
				return nil
			})
			owner := func(bucket string, k []byte) (string, []byte) {
				i := bytes.IndexByte(k, 0)
				if i < 0 {
					add("%s: key %q has no client id separator", bucket, k)
					return "", nil
				}
				if !sessions[string(k[:i])] {
					add("%s: key %q belongs to no stored session", bucket, k)
				}
				return string(k[:i]), k[i+1:]
			}
			each(bucketSubs, func(k, v []byte) error {
				owner("subs", k)
				if len(v) != 5 {
					add("subs: record of %q is %d bytes, want 5", k, len(v))
				}
				return nil
			})
			pids := map[string]map[uint16]bool{}
			each(bucketQueue, func(k, v []byte) error {
				id, rest := owner("queue", k)
				if rest == nil {
					return nil
				}
				if len(rest) != 8 {
					add("queue: key %q has no 8-byte sequence", k)
					return nil
				}
				q, ok := decodeQueued(binary.BigEndian.Uint64(rest), v)
				if !ok {
					add("queue: record of %q does not decode", k)
					return nil
				}
				if q.PID != 0 {
					if pids[id] == nil {
						pids[id] = map[uint16]bool{}
					}
					if pids[id][q.PID] {
						add("queue: session %q has packet identifier %d in flight twice", id, q.PID)
					}
					pids[id][q.PID] = true
				}
				return nil
			})
			each(bucketRel, func(k, _ []byte) error {
				if _, rest := owner("rel", k); rest != nil && len(rest) != 2 {
					add("rel: key %q has no 2-byte packet identifier", k)
				}
				return nil
			})
			each(bucketRetained, func(k, v []byte) error {
				m, ok := decodeMessage(v)
				if !ok {
					add("retained: record of %q does not decode", k)
				} else if m.Topic != string(k) {
					add("retained: record under %q names topic %q", k, m.Topic)
				}
				return nil
			})
			retained := tx.Bucket(bucketRetained)
			each(bucketRetainedBy, func(k, v []byte) error {
				switch {
				case len(v) == 0 || v[0] != 'u':
					add("retainedby: record of %q is not an owner", k)
				case retained != nil && retained.Get(k) == nil:
					add("retainedby: %q has an owner but no retained message", k)
				}
				return nil
			})
			checkSequenced(tx, bucketOutbox, "entry", func(v []byte) bool { _, _, _, ok := splitOutbox(v); return ok }, add)
			checkSequenced(tx, bucketDeadLetter, "dead letter", func(v []byte) bool { _, ok := decodeDeadLetter(0, v); return ok }, add)
			each(bucketUpflight, func(bridge, v []byte) error {
				if v != nil {
					add("upflight: key %q is a record, want a bridge's bucket", bridge)
					return nil
				}
				return tx.Bucket(bucketUpflight).Bucket(bridge).ForEach(func(k, v []byte) error {
					if _, ok := decodeUpflight(k, v); !ok {
						add("upflight %q: record under key %q does not decode", bridge, k)
					}
					return nil
				})
			})
			return nil
		})
	})
	if err != nil {
		add("%v", err)
	}
	return problems
}

// checkSequenced checks a bucket of bridges' buckets whose records are
// keyed by an 8-byte sequence from 1 (the outbox, the dead letters), each
// record as decodes says; noun names one record in the problems.
func checkSequenced(tx *bolt.Tx, bucket []byte, noun string, decodes func(v []byte) bool, add func(format string, args ...any)) {
	bb := tx.Bucket(bucket)
	if bb == nil {
		add("bucket %s is missing", bucket)
		return
	}
	_ = bb.ForEach(func(bridge, v []byte) error {
		if v != nil {
			add("%s: key %q is a record, want a bridge's bucket", bucket, bridge)
			return nil
		}
		return bb.Bucket(bridge).ForEach(func(k, v []byte) error {
			switch {
			case v == nil:
				add("%s %q: key %q is a bucket, want %s", bucket, bridge, k, article(noun))
			case len(k) != 8:
				add("%s %q: key %q has no 8-byte sequence", bucket, bridge, k)
			case binary.BigEndian.Uint64(k) == 0:
				add("%s %q: %s with sequence 0, which no scan returns", bucket, bridge, noun)
			case !decodes(v):
				add("%s %q: record of sequence %d does not decode", bucket, bridge, binary.BigEndian.Uint64(k))
			}
			return nil
		})
	})
}

// article puts a or an before noun.
func article(noun string) string {
	if strings.ContainsRune("aeiou", rune(noun[0])) {
		return "an " + noun
	}
	return "a " + noun
}

// shortKeys shortens long keys in bbolt's check messages.
type shortKeys struct{}

func (shortKeys) KeyToString(k []byte) string {
	if len(k) > 64 {
		return fmt.Sprintf("%q… (%d bytes)", k[:16], len(k))
	}
	return fmt.Sprintf("%q", k)
}

func (s shortKeys) ValueToString(v []byte) string { return s.KeyToString(v) }

// BucketStats describes one bucket for fieldgate db stats.
type BucketStats struct {
	Name       string
	Keys       int // including those in nested buckets: the outbox's bridges and their entries
	KeyBytes   int64
	ValueBytes int64
	Pages      int // leaf and branch pages in use
}

// OutboxStats describes one bridge's outbox for fieldgate db stats.
type OutboxStats struct {
	Bridge string
	OutboxInfo
	Undecodable int // entries left out of OutboxInfo: they do not decode
}

// DeadLetterStats describes one bridge's dead letters for fieldgate db
// stats.
type DeadLetterStats struct {
	Bridge string
	DeadLetterInfo
	Undecodable int // dead letters left out of DeadLetterInfo: they do not decode
}

// FileStats describes the whole file.
type FileStats struct {
	Path      string
	Size      int64 // bytes on disk
	PageSize  int
	FreePages int
	Schema    int
	Sessions  int
	Buckets   []BucketStats
	Outboxes  []OutboxStats // by bridge name
	// DeadLetters are the bridges' dead letters, by bridge name: those
	// of every bridge that ever moved one, none or not.
	DeadLetters []DeadLetterStats
}

// Stats reads what the file holds, bucket by bucket.
func (db *DB) Stats() (FileStats, error) {
	fs := FileStats{Path: db.path, PageSize: db.bolt.Info().PageSize, Schema: SchemaVersion}
	err := guard("stats", func() error {
		return db.bolt.View(func(tx *bolt.Tx) error {
			fs.Size = tx.Size()
			st := db.bolt.Stats()
			fs.FreePages = st.FreePageN
			return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
				bs := BucketStats{Name: string(name)}
				s := b.Stats()
				bs.Pages = s.LeafPageN + s.BranchPageN
				var count func(b *bolt.Bucket)
				count = func(b *bolt.Bucket) {
					_ = b.ForEach(func(k, v []byte) error {
						bs.Keys++
						bs.KeyBytes += int64(len(k))
						bs.ValueBytes += int64(len(v))
						if v == nil {
							count(b.Bucket(k))
						}
						return nil
					})
				}
				count(b)
				switch {
				case bytes.Equal(name, bucketSessions):
					fs.Sessions = bs.Keys
				case bytes.Equal(name, bucketOutbox):
					_ = b.ForEach(func(k, v []byte) error {
						if v == nil {
							bad := &OutboxDecodeError{}
							info := summarise(b.Bucket(k), bad)
							fs.Outboxes = append(fs.Outboxes, OutboxStats{Bridge: string(k), OutboxInfo: info, Undecodable: len(bad.Seqs) + bad.BadKeys})
						}
						return nil
					})
				case bytes.Equal(name, bucketDeadLetter):
					_ = b.ForEach(func(k, v []byte) error {
						if v == nil {
							bad := &OutboxDecodeError{}
							info := summariseDead(b.Bucket(k), bad)
							fs.DeadLetters = append(fs.DeadLetters, DeadLetterStats{Bridge: string(k), DeadLetterInfo: info, Undecodable: len(bad.Seqs) + bad.BadKeys})
						}
						return nil
					})
				}
				fs.Buckets = append(fs.Buckets, bs)
				return nil
			})
		})
	})
	sort.Slice(fs.Buckets, func(i, j int) bool { return fs.Buckets[i].Name < fs.Buckets[j].Name })
	return fs, err
}
