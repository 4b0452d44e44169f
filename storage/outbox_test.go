package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// entry is an outbox entry whose fields all derive from seq.
func entry(seq uint64) *OutboxEntry {
	e := &OutboxEntry{
		Seq: seq, Route: uint16(seq % 7), Added: 1_750_000_000_000_000_000 + int64(seq%1000)*1e9,
		Msg: Message{Topic: fmt.Sprintf("site/up/%d", seq), Payload: []byte(fmt.Sprint("payload ", seq)), QoS: byte(seq % 3), Retain: seq%2 == 0},
	}
	if seq%3 == 0 {
		e.Msg.Props = []byte{0x01, byte(seq)}
		e.Msg.Expiry = 1_900_000_000_000_000_000 + int64(seq)
	}
	return e
}

// sameEntry reports how two entries differ, or "" when they do not.
func sameEntry(got, want *OutboxEntry) string {
	if got.Seq != want.Seq || got.Route != want.Route || got.Added != want.Added {
		return fmt.Sprintf("seq/route/added %d/%d/%d, want %d/%d/%d", got.Seq, got.Route, got.Added, want.Seq, want.Route, want.Added)
	}
	if d := sameMessage(&got.Msg, &want.Msg); d != "" {
		return fmt.Sprintf("seq %d: %s", got.Seq, d)
	}
	return ""
}

// scanAll returns what OutboxScan passes to fn, and its error.
func scanAll(t testing.TB, db *DB, bridge string, after uint64, max int) ([]*OutboxEntry, error) {
	t.Helper()
	var got []*OutboxEntry
	err := db.OutboxScan(bridge, after, max, func(e *OutboxEntry) bool {
		got = append(got, e)
		return true
	})
	return got, err
}

// scanSeqs returns the sequences OutboxScan passes, failing on an error.
func scanSeqs(t testing.TB, db *DB, bridge string, after uint64, max int) []uint64 {
	t.Helper()
	got, err := scanAll(t, db, bridge, after, max)
	if err != nil {
		t.Fatalf("scan %s after %d max %d: %v", bridge, after, max, err)
	}
	var seqs []uint64
	for _, e := range got {
		seqs = append(seqs, e.Seq)
	}
	return seqs
}

func bridges(t testing.TB, db *DB) []string {
	t.Helper()
	names, err := db.OutboxBridges()
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// TestOutboxPutScan stores entries out of order, in several batches and
// bridges whose names prefix one another, and reads them back in order,
// whole, across a reopen.
func TestOutboxPutScan(t *testing.T) {
	db := openTemp(t, Options{})
	order := []uint64{256, 1, 1 << 40, 2, 255, math.MaxUint64, 3}
	for _, seq := range order {
		commit(t, db, func(b *Batch) {
			b.OutboxPut("cloud", entry(seq))
			b.OutboxPut("cloud2", entry(seq%1000+1000))
		})
	}
	commit(t, db, func(b *Batch) { b.OutboxPut("c", entry(9)) })
	want := slices.Clone(order)
	slices.Sort(want)
	for round := range 2 {
		got, err := scanAll(t, db, "cloud", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("round %d: %d entries, want %d", round, len(got), len(want))
		}
		for i, e := range got {
			if d := sameEntry(e, entry(want[i])); d != "" {
				t.Errorf("round %d entry %d: %s", round, i, d)
			}
		}
		if s := scanSeqs(t, db, "c", 0, 0); !slices.Equal(s, []uint64{9}) {
			t.Errorf("bridge c: %v", s)
		}
		if s := scanSeqs(t, db, "cloud2", 0, 1); !slices.Equal(s, []uint64{1001}) {
			t.Errorf("bridge cloud2: %v", s)
		}
		if s := scanSeqs(t, db, "clou", 0, 0); s != nil {
			t.Errorf("bridge clou, which has none: %v", s)
		}
		if b := bridges(t, db); !slices.Equal(b, []string{"c", "cloud", "cloud2"}) {
			t.Errorf("bridges %q", b)
		}
		db = reopen(t, db, Options{})
	}
	// A put of a stored sequence replaces the entry.
	e := entry(2)
	e.Msg.Payload = []byte("replaced")
	commit(t, db, func(b *Batch) { b.OutboxPut("cloud", e) })
	if got, _ := scanAll(t, db, "cloud", 1, 1); len(got) != 1 || sameEntry(got[0], e) != "" {
		t.Errorf("after replacing 2: %+v", got)
	}
}

func TestOutboxScanAfterMax(t *testing.T) {
	db := openTemp(t, Options{})
	commit(t, db, func(b *Batch) {
		for _, seq := range []uint64{1, 2, 3, 5, 8, 13, 21} {
			b.OutboxPut("cloud", entry(seq))
		}
	})
	for _, tc := range []struct {
		after uint64
		max   int
		stop  int // fn returns false on this call, 0 for never
		want  []uint64
	}{
		{0, 0, 0, []uint64{1, 2, 3, 5, 8, 13, 21}},
		{0, -1, 0, []uint64{1, 2, 3, 5, 8, 13, 21}},
		{0, 3, 0, []uint64{1, 2, 3}},
		{3, 0, 0, []uint64{5, 8, 13, 21}},
		{4, 2, 0, []uint64{5, 8}},
		{5, 100, 0, []uint64{8, 13, 21}},
		{20, 0, 0, []uint64{21}},
		{21, 0, 0, nil},
		{math.MaxUint64, 0, 0, nil},
		{0, 0, 2, []uint64{1, 2}},
		{2, 5, 1, []uint64{3}},
	} {
		var got []uint64
		err := db.OutboxScan("cloud", tc.after, tc.max, func(e *OutboxEntry) bool {
			got = append(got, e.Seq)
			return len(got) != tc.stop
		})
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("after %d max %d stop %d: %v %v, want %v", tc.after, tc.max, tc.stop, got, err, tc.want)
		}
	}
}

// TestOutboxScanChunks reads more entries, and more bytes, than one read
// transaction takes, with a callback that commits (and waits) meanwhile:
// the scan must pass every entry once, in order, and not deadlock.
func TestOutboxScanChunks(t *testing.T) {
	db := openTemp(t, Options{})
	n := 3*outboxScanEntries + 17
	big := bytes.Repeat([]byte{'x'}, outboxScanBytes/3)
	commit(t, db, func(b *Batch) {
		for seq := 1; seq <= n; seq++ {
			e := entry(uint64(seq))
			if seq%100 == 50 {
				e.Msg.Payload = big // some chunks end at the byte bound
			}
			b.OutboxPut("cloud", e)
		}
	})
	var got []uint64
	err := db.OutboxScan("cloud", 0, 0, func(e *OutboxEntry) bool {
		got = append(got, e.Seq)
		want := entry(e.Seq)
		if e.Seq%100 == 50 && e.Seq <= uint64(n) {
			want.Msg.Payload = big
		}
		if d := sameEntry(e, want); d != "" {
			t.Error(d)
		}
		// The bridge deletes what was acknowledged and queues more while
		// it reads: an entry deleted behind the scan is not seen again,
		// one added ahead of it may be.
		commit(t, db, func(b *Batch) {
			b.OutboxDelete("cloud", e.Seq)
			if e.Seq%10 == 0 && e.Seq <= uint64(n) {
				b.OutboxPut("cloud", entry(uint64(n)+e.Seq/10))
			}
		})
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) < n {
		t.Fatalf("passed %d entries, want at least %d", len(got), n)
	}
	for i, seq := range got {
		if i < n && seq != uint64(i+1) || i >= n && seq <= got[i-1] {
			t.Fatalf("entry %d is %d: %v", i, seq, got)
		}
	}
	// What the scan did not reach is what was added after it read past
	// it: nothing lost, nothing passed twice.
	var want []uint64
	for seq := uint64(n) + 1; seq <= uint64(n+n/10); seq++ {
		if !slices.Contains(got, seq) {
			want = append(want, seq)
		}
	}
	if left := scanSeqs(t, db, "cloud", 0, 0); !slices.Equal(left, want) {
		t.Errorf("left after the scan %v, want %v", left, want)
	}
}

// TestOutboxScanMaxAcrossChunks: max larger than a chunk is honoured
// exactly, and the entries the scan passed stay intact after the file
// changed and grew under them.
func TestOutboxScanMaxAcrossChunks(t *testing.T) {
	db := openTemp(t, Options{})
	n := 2*outboxScanEntries + 40
	commit(t, db, func(b *Batch) {
		for seq := 1; seq <= n; seq++ {
			b.OutboxPut("cloud", entry(uint64(seq)))
		}
	})
	max := outboxScanEntries + 10
	kept, err := scanAll(t, db, "cloud", 5, max)
	if err != nil || len(kept) != max || kept[0].Seq != 6 || kept[max-1].Seq != uint64(5+max) {
		t.Fatalf("scan after 5 max %d: %d entries, %v", max, len(kept), err)
	}
	// Delete them all and write megabytes, so that bbolt reuses their
	// pages and remaps the file: the entries must own their memory.
	commit(t, db, func(b *Batch) { b.OutboxDrop("cloud") })
	for i := range 20 {
		commit(t, db, func(b *Batch) {
			for j := range 50 {
				b.OutboxPut("other", &OutboxEntry{Seq: uint64(i*50 + j + 1), Msg: Message{Topic: "t", Payload: bytes.Repeat([]byte{0xee}, 4000)}})
			}
		})
	}
	for _, e := range kept {
		if d := sameEntry(e, entry(e.Seq)); d != "" {
			t.Fatalf("a kept entry changed: %s", d)
		}
	}
}

func TestOutboxDeleteDrop(t *testing.T) {
	db := openTemp(t, Options{})
	commit(t, db, func(b *Batch) {
		for seq := uint64(1); seq <= 5; seq++ {
			b.OutboxPut("cloud", entry(seq))
			b.OutboxPut("backup", entry(seq))
		}
	})
	commit(t, db, func(b *Batch) {
		b.OutboxDelete("cloud", 2)
		b.OutboxDelete("cloud", 4)
		b.OutboxDelete("cloud", 99)     // absent
		b.OutboxDelete("nowhere", 1)    // no such outbox
		b.OutboxDrop("never-had-one")   // neither
		b.OutboxDelete("backup", 5)     // then put again in the same batch
		b.OutboxPut("backup", entry(5)) // ops apply in order
	})
	if s := scanSeqs(t, db, "cloud", 0, 0); !slices.Equal(s, []uint64{1, 3, 5}) {
		t.Errorf("cloud after deletes: %v", s)
	}
	if s := scanSeqs(t, db, "backup", 0, 0); !slices.Equal(s, []uint64{1, 2, 3, 4, 5}) {
		t.Errorf("backup, untouched: %v", s)
	}
	// Emptied, an outbox is still there until dropped.
	commit(t, db, func(b *Batch) {
		for _, seq := range []uint64{1, 3, 5} {
			b.OutboxDelete("cloud", seq)
		}
	})
	if b := bridges(t, db); !slices.Equal(b, []string{"backup", "cloud"}) {
		t.Errorf("bridges after emptying cloud: %q", b)
	}
	commit(t, db, func(b *Batch) { b.OutboxDrop("backup") })
	db = reopen(t, db, Options{})
	if b := bridges(t, db); !slices.Equal(b, []string{"cloud"}) {
		t.Errorf("bridges after dropping backup: %q", b)
	}
	if s := scanSeqs(t, db, "backup", 0, 0); s != nil {
		t.Errorf("dropped outbox scans %v", s)
	}
	if info, err := db.OutboxInfo("backup"); err != nil || info != (OutboxInfo{}) {
		t.Errorf("dropped outbox: %+v, %v", info, err)
	}
	// A dropped outbox starts again with the next put; a drop and a put
	// in one batch leave the put.
	commit(t, db, func(b *Batch) {
		b.OutboxPut("backup", entry(7))
		b.OutboxDrop("cloud")
		b.OutboxPut("cloud", entry(8))
	})
	if s := scanSeqs(t, db, "backup", 0, 0); !slices.Equal(s, []uint64{7}) {
		t.Errorf("backup after a drop and a put: %v", s)
	}
	if s := scanSeqs(t, db, "cloud", 0, 0); !slices.Equal(s, []uint64{8}) {
		t.Errorf("cloud after a drop and a put in one batch: %v", s)
	}
	if b := bridges(t, db); !slices.Equal(b, []string{"backup", "cloud"}) {
		t.Errorf("bridges %q", b)
	}
}

func TestOutboxInfo(t *testing.T) {
	db := openTemp(t, Options{})
	if info, err := db.OutboxInfo("cloud"); err != nil || info != (OutboxInfo{}) {
		t.Fatalf("no outbox: %+v, %v", info, err)
	}
	entries := []*OutboxEntry{entry(10), entry(11), entry(12), entry(40)}
	entries[0].Added = 5_000
	entries[1].Added = 4_000 // the clock went back: the oldest is not the first
	entries[2].Added = 6_000
	entries[3].Added = 7_000
	entries[3].Msg.Payload = make([]byte, 3000)
	commit(t, db, func(b *Batch) {
		for _, e := range entries {
			b.OutboxPut("cloud", e)
		}
		b.OutboxPut("backup", entry(1))
	})
	var bytes int64
	for _, e := range entries {
		bytes += int64(e.Size())
	}
	want := OutboxInfo{Count: 4, Bytes: bytes, FirstSeq: 10, LastSeq: 40, Oldest: 4_000}
	for range 2 {
		if info, err := db.OutboxInfo("cloud"); err != nil || info != want {
			t.Errorf("info %+v, %v; want %+v", info, err, want)
		}
		db = reopen(t, db, Options{})
	}
	commit(t, db, func(b *Batch) {
		b.OutboxDelete("cloud", 10)
		b.OutboxDelete("cloud", 11)
		b.OutboxDelete("cloud", 40)
	})
	want = OutboxInfo{Count: 1, Bytes: int64(entries[2].Size()), FirstSeq: 12, LastSeq: 12, Oldest: 6_000}
	if info, err := db.OutboxInfo("cloud"); err != nil || info != want {
		t.Errorf("after deletes: %+v, %v; want %+v", info, err, want)
	}
	commit(t, db, func(b *Batch) { b.OutboxDelete("cloud", 12) })
	if info, err := db.OutboxInfo("cloud"); err != nil || info != (OutboxInfo{}) {
		t.Errorf("emptied: %+v, %v", info, err)
	}
	if info, err := db.OutboxInfo("backup"); err != nil || info.Count != 1 || info.FirstSeq != 1 {
		t.Errorf("backup: %+v, %v", info, err)
	}
}

// TestOutboxMixedBatch: outbox writes share a commit with a publish's
// other effects, whole or not at all, durable or lazy.
func TestOutboxMixedBatch(t *testing.T) {
	db := openTemp(t, Options{LazyDelay: time.Hour})
	var b Batch
	b.PutSession(&Session{ClientID: "dev"})
	b.Enqueue("dev", queued(1, "local"))
	b.OutboxPut("cloud", entry(1))
	b.SetRetained(&Message{Topic: "site/r", Payload: []byte("v"), Retain: true})
	b.OutboxPut("cloud", entry(2))
	b.OutboxPut("backup", entry(1))
	if err := db.CommitWait(&b); err != nil {
		t.Fatal(err)
	}
	queuedBefore := db.QueuedBytes()
	if want := int64(len(appendQueued(nil, queued(1, "local")))); queuedBefore != want {
		t.Errorf("queued bytes %d, want %d: the outbox is not a session's queue", queuedBefore, want)
	}

	// A batch the commit refuses writes none of its other effects either.
	var bad Batch
	bad.Enqueue("dev", queued(2, "lost"))
	bad.SetRetained(&Message{Topic: "site/lost", Retain: true})
	bad.OutboxPut("cloud", entry(3))
	bad.OutboxPut("", entry(4))
	errIs(t, db.CommitWait(&bad), ErrInvalidWrite)

	// Lazy: rides with the next durable commit.
	var lazy Batch
	lazy.OutboxPut("cloud", entry(5))
	lazy.OutboxDelete("cloud", 1)
	db.CommitLazy(&lazy)
	if s := scanSeqs(t, db, "cloud", 0, 0); !slices.Equal(s, []uint64{1, 2}) {
		t.Errorf("cloud with the lazy batch waiting: %v", s)
	}
	commit(t, db, func(b *Batch) { b.Dequeue("dev", 1) })
	if s := scanSeqs(t, db, "cloud", 0, 0); !slices.Equal(s, []uint64{2, 5}) {
		t.Errorf("cloud after the lazy batch: %v", s)
	}
	// Lazy with nothing to follow: Close writes it.
	lazy = Batch{}
	lazy.OutboxPut("cloud", entry(6))
	db.CommitLazy(&lazy)
	db = reopen(t, db, Options{})

	if s := scanSeqs(t, db, "cloud", 0, 0); !slices.Equal(s, []uint64{2, 5, 6}) {
		t.Errorf("cloud after reopen: %v", s)
	}
	if s := scanSeqs(t, db, "backup", 0, 0); !slices.Equal(s, []uint64{1}) {
		t.Errorf("backup after reopen: %v", s)
	}
	st := loadAll(t, db)["dev"]
	if st == nil || len(st.Queue) != 0 {
		t.Errorf("session after reopen: %+v", st)
	}
	if m, _ := db.Retained("site/r"); m == nil {
		t.Error("retained message of the mixed batch lost")
	}
	if m, _ := db.Retained("site/lost"); m != nil {
		t.Error("retained message of the refused batch stored")
	}
	if db.QueuedBytes() != 0 {
		t.Errorf("queued bytes %d after the dequeue", db.QueuedBytes())
	}
}

func TestOutboxValidate(t *testing.T) {
	db := openTemp(t, Options{})
	long := strings.Repeat("b", bolt.MaxKeySize+1)
	for _, tc := range []struct {
		name  string
		build func(b *Batch)
		says  string
	}{
		{"put, empty bridge", func(b *Batch) { b.OutboxPut("", entry(1)) }, "named with 0 bytes"},
		{"delete, empty bridge", func(b *Batch) { b.OutboxDelete("", 1) }, "named with 0 bytes"},
		{"drop, empty bridge", func(b *Batch) { b.OutboxDrop("") }, "named with 0 bytes"},
		{"bridge name too long", func(b *Batch) { b.OutboxPut(long, entry(1)) }, "named with 32769 bytes"},
		{"sequence 0", func(b *Batch) { b.OutboxPut("cloud", entry(0)) }, "sequence 0"},
		{"empty bridge after a good one", func(b *Batch) {
			b.OutboxPut("cloud", entry(1))
			b.OutboxDelete("", 1)
		}, "named with 0 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b Batch
			tc.build(&b)
			err := db.CommitWait(&b)
			errIs(t, err, ErrInvalidWrite)
			if !strings.Contains(err.Error(), tc.says) {
				t.Errorf("error %q does not say %q", err, tc.says)
			}
		})
	}
	lost := db.CommitStats().LazyLost
	var b Batch
	b.OutboxPut("", entry(1))
	db.CommitLazy(&b)
	if got := db.CommitStats().LazyLost; got != lost+1 {
		t.Errorf("a refused lazy batch counted %d lost, want %d", got-lost, 1)
	}
	if names := bridges(t, db); names != nil {
		t.Errorf("refused writes made outboxes %q", names)
	}
}

// TestOutboxPutAllocs holds OutboxPut, which every bridged publish calls,
// to one encode into the batch's arena: a batch of one put allocates the
// arena and its op list, and puts after that share both.
func TestOutboxPutAllocs(t *testing.T) {
	e := &OutboxEntry{Seq: 1, Route: 2, Added: 3, Msg: Message{Topic: "site/gh-1/temp", Payload: []byte(`{"value":21.5}`), Props: []byte{1, 1}, QoS: 1}}
	if n := testing.AllocsPerRun(100, func() {
		var b Batch
		b.OutboxPut("cloud", e)
	}); n != 2 {
		t.Errorf("a batch of one put: %v allocations, want 2 (arena, ops)", n)
	}
	if n := testing.AllocsPerRun(20, func() {
		var b Batch
		for seq := range uint64(1000) {
			e.Seq = seq + 1
			b.OutboxPut("cloud", e)
			b.OutboxDelete("cloud", seq)
		}
	}); n > 40 {
		t.Errorf("a batch of 1000 puts and deletes: %v allocations, want the arena's and op list's growth only", n)
	}
	var b Batch
	b.OutboxPut("cloud", e)
	b.OutboxPut("backup", e)
	b.OutboxPut("cloud", e)
	if want := 3 * (8 + len(appendOutbox(nil, e))); b.Bytes() != want {
		t.Errorf("batch bytes %d, want %d", b.Bytes(), want)
	}
	for i, want := range []string{"cloud", "backup", "cloud"} {
		if o := b.ops[i]; string(o.sub) != want || len(o.key) != 8 || cap(o.val) != len(o.val) {
			t.Errorf("op %d: bridge %q key %x, value %d of cap %d", i, o.sub, o.key, len(o.val), cap(o.val))
		}
	}
}

// TestOutboxDecodeFailure plants what no commit writes in an outbox: a
// record that does not decode, a key that is no sequence, buckets where
// entries belong, records where a bridge's bucket belongs. A scan passes
// the rest and reports them after, in an error that names what
// OutboxDelete can remove; puts replace them, and deletes and drops
// remove them, without failing a commit.
func TestOutboxDecodeFailure(t *testing.T) {
	db := openTemp(t, Options{})
	commit(t, db, func(b *Batch) {
		for seq := uint64(1); seq <= 6; seq++ {
			b.OutboxPut("cloud", entry(seq))
		}
	})
	path := db.Path()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		ob := tx.Bucket(bucketOutbox)
		cloud := ob.Bucket([]byte("cloud"))
		if err := cloud.Put(outboxKeyBytes(3), []byte{0, 1, 2}); err != nil {
			return err
		}
		if err := cloud.Put([]byte{0, 0, 0, 0, 0, 0, 0, 4, 9}, appendOutbox(nil, entry(4))); err != nil {
			return err
		}
		if err := cloud.Delete(outboxKeyBytes(5)); err != nil {
			return err
		}
		for _, seq := range []uint64{5, 8} {
			if _, err := cloud.CreateBucket(outboxKeyBytes(seq)); err != nil {
				return err
			}
		}
		for _, name := range []string{"stray", "stray2"} {
			if err := ob.Put([]byte(name), []byte("x")); err != nil {
				return err
			}
		}
		return nil
	})
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { db.Close() }()

	got, err := scanAll(t, db, "cloud", 0, 0)
	var seqs []uint64
	for _, e := range got {
		seqs = append(seqs, e.Seq)
	}
	if !slices.Equal(seqs, []uint64{1, 2, 4, 6}) {
		t.Errorf("scan passed %v, want 1 2 4 6", seqs)
	}
	errIs(t, err, ErrCorrupt)
	var de *OutboxDecodeError
	if !errors.As(err, &de) || de.Bridge != "cloud" || !slices.Equal(de.Seqs, []uint64{3, 5, 8}) || de.BadKeys != 1 {
		t.Fatalf("scan error %#v, want seqs 3, 5, 8 and one bad key of cloud", err)
	}
	for _, s := range []string{`"cloud"`, "3 entries do not decode (sequence 3, 5, 8)", "1 keys are no 8-byte sequence"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	// A scan that stops before the damage does not report it.
	if s, err := scanAll(t, db, "cloud", 0, 2); err != nil || len(s) != 2 {
		t.Errorf("scan of 2: %d entries, %v", len(s), err)
	}
	info, err := db.OutboxInfo("cloud")
	if want := (OutboxInfo{Count: 4, Bytes: int64(entry(1).Size() + entry(2).Size() + entry(4).Size() + entry(6).Size()), FirstSeq: 1, LastSeq: 6, Oldest: entry(1).Added}); info != want {
		t.Errorf("info %+v, want %+v", info, want)
	}
	if !errors.As(err, &de) || !slices.Equal(de.Seqs, []uint64{3, 5, 8}) || de.BadKeys != 1 {
		t.Errorf("info error %v", err)
	}
	if b := bridges(t, db); !slices.Equal(b, []string{"cloud"}) {
		t.Errorf("bridges %q: a record is no bridge", b)
	}
	st, err := db.Stats()
	if err != nil || len(st.Outboxes) != 1 || st.Outboxes[0].Count != 4 || st.Outboxes[0].Undecodable != 4 {
		t.Errorf("stats outboxes %+v, %v", st.Outboxes, err)
	}

	// A put replaces a bucket where its entry belongs, and a record where
	// its outbox belongs; the commit succeeds.
	commit(t, db, func(b *Batch) {
		b.OutboxPut("cloud", entry(5))
		b.OutboxPut("stray", entry(1))
	})
	got, err = scanAll(t, db, "cloud", 4, 2)
	if err != nil || len(got) != 2 || sameEntry(got[0], entry(5)) != "" {
		t.Errorf("scan after putting 5 over a bucket: %+v, %v", got, err)
	}
	if s := scanSeqs(t, db, "stray", 0, 0); !slices.Equal(s, []uint64{1}) {
		t.Errorf("outbox put over a record: %v", s)
	}
	// What the error names, OutboxDelete removes, the bucket too.
	_, err = scanAll(t, db, "cloud", 0, 0)
	if !errors.As(err, &de) || !slices.Equal(de.Seqs, []uint64{3, 8}) {
		t.Fatalf("scan after the puts: %v", err)
	}
	commit(t, db, func(b *Batch) {
		for _, seq := range de.Seqs {
			b.OutboxDelete("cloud", seq)
		}
	})
	_, err = scanAll(t, db, "cloud", 0, 0)
	if !errors.As(err, &de) || de.Seqs != nil || de.BadKeys != 1 || strings.Contains(err.Error(), "do not decode") {
		t.Errorf("after deleting the named entries: %v", err)
	}
	// The rest goes with the outbox; a drop removes a stray record too.
	commit(t, db, func(b *Batch) {
		b.OutboxDrop("cloud")
		b.OutboxDrop("stray")
		b.OutboxDrop("stray2")
	})
	if problems := db.Check(); len(problems) > 0 {
		t.Errorf("check after the drops: %q", problems)
	}
	if b := bridges(t, db); b != nil {
		t.Errorf("bridges after the drops: %q", b)
	}
}

func outboxKeyBytes(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// TestOutboxScanByteBound: a read transaction of a scan stops at
// outboxScanBytes of records, so that an outbox of large messages is
// never all in memory at once. It shows in what a scan sees: an entry
// replaced while the scan calls back is read afresh by the next
// transaction.
func TestOutboxScanByteBound(t *testing.T) {
	db := openTemp(t, Options{})
	half := bytes.Repeat([]byte{'h'}, outboxScanBytes/2)
	commit(t, db, func(b *Batch) {
		for seq := uint64(1); seq <= 6; seq++ {
			b.OutboxPut("cloud", &OutboxEntry{Seq: seq, Msg: Message{Topic: "big", Payload: half}})
		}
	})
	var got []string
	err := db.OutboxScan("cloud", 0, 0, func(e *OutboxEntry) bool {
		got = append(got, fmt.Sprint(e.Seq, len(e.Msg.Payload)))
		if e.Seq == 1 {
			commit(t, db, func(b *Batch) {
				b.OutboxPut("cloud", &OutboxEntry{Seq: 3, Msg: Message{Topic: "big", Payload: []byte("replaced")}})
			})
		}
		return true
	})
	want := []string{"1 524288", "2 524288", "3 8", "4 524288", "5 524288", "6 524288"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("scan passed %q, %v; want %q (entries 1 and 2 in the first transaction)", got, err, want)
	}
}
