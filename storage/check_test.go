package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func TestCheckClean(t *testing.T) {
	db := openTemp(t, Options{})
	if problems := db.Check(); len(problems) > 0 {
		t.Fatalf("new file: %q", problems)
	}
	commit(t, db, func(b *Batch) {
		b.PutSession(&Session{ClientID: "a", Will: &Will{Msg: Message{Topic: "w"}}})
		b.PutSub("a", Sub{Filter: "x/#"})
		b.Enqueue("a", &Queued{Seq: 1, PID: 1, Msg: Message{Topic: "x/1"}})
		b.Enqueue("a", &Queued{Seq: 2, PID: 2, Msg: Message{Topic: "x/2"}})
		b.Enqueue("a", &Queued{Seq: 3, Msg: Message{Topic: "x/3"}})
		b.Enqueue("a", &Queued{Seq: 4, Msg: Message{Topic: "x/4"}}) // two unsent: both pid 0
		b.AddAwaitingRel("a", 1)
		b.PutSession(&Session{ClientID: "b"})
		b.Enqueue("b", &Queued{Seq: 1, PID: 1, Msg: Message{Topic: "x/1"}}) // pid 1 again, another session
		b.SetRetained(&Message{Topic: "x/1"})
		b.OutboxPut("cloud", entry(1))
		b.OutboxPut("cloud", entry(2))
		b.OutboxPut("backup", entry(1))
		b.OutboxPut("emptied", entry(1))
		b.OutboxDelete("emptied", 1)
	})
	if problems := db.Check(); len(problems) > 0 {
		t.Fatalf("sound file: %q", problems)
	}
}

// TestCheckOutbox plants what no outbox write makes and expects Check to
// name each problem, and nothing else.
func TestCheckOutbox(t *testing.T) {
	db := openTemp(t, Options{})
	commit(t, db, func(b *Batch) {
		for seq := uint64(1); seq <= 4; seq++ {
			b.OutboxPut("cloud", entry(seq))
		}
		b.OutboxPut("backup", entry(9))
	})
	path := db.Path()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		ob := tx.Bucket(bucketOutbox)
		cloud := ob.Bucket([]byte("cloud"))
		short := appendOutbox(nil, entry(2))
		for _, p := range []struct{ k, v []byte }{
			{outboxKeyBytes(2), short[:len(short)-len(entry(2).Msg.Payload)-3]},     // cut inside the topic
			{outboxKeyBytes(3), append([]byte{0, 1, 0, 0, 0, 0, 0, 0, 0, 5}, 0x0b)}, // bad message flags
			{[]byte{1, 2, 3}, appendOutbox(nil, entry(5))},
			{outboxKeyBytes(0), appendOutbox(nil, entry(6))},
		} {
			if err := cloud.Put(p.k, p.v); err != nil {
				return err
			}
		}
		if _, err := cloud.CreateBucket(outboxKeyBytes(7)); err != nil {
			return err
		}
		return ob.Put([]byte("stray"), []byte("not a bucket"))
	})
	ro, err := OpenReadOnly(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	problems := ro.Check()
	all := strings.Join(problems, "\n")
	for _, want := range []string{
		`outbox "cloud": record of sequence 2 does not decode`,
		`outbox "cloud": record of sequence 3 does not decode`,
		`outbox "cloud": key "\x01\x02\x03" has no 8-byte sequence`,
		`outbox "cloud": entry with sequence 0, which no scan returns`,
		`outbox "cloud": key "\x00\x00\x00\x00\x00\x00\x00\a" is a bucket, want an entry`,
		`outbox: key "stray" is a record, want a bridge's bucket`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("check did not report %s", want)
		}
	}
	if len(problems) != 6 {
		t.Errorf("%d problems, want 6:\n%s", len(problems), all)
	}
	if strings.Contains(all, "backup") || strings.Contains(all, "sequence 1 ") || strings.Contains(all, "sequence 4") {
		t.Errorf("check reported a sound entry:\n%s", all)
	}
}

// TestCheckPlanted writes what no commit writes, with bbolt directly, and
// expects Check to name each problem.
func TestCheckPlanted(t *testing.T) {
	db := openTemp(t, Options{})
	commit(t, db, func(b *Batch) {
		b.PutSession(&Session{ClientID: "dev"})
		b.PutSub("dev", Sub{Filter: "ok/#"})
		b.Enqueue("dev", &Queued{Seq: 1, PID: 7, Msg: Message{Topic: "q/1"}})
		b.Enqueue("dev", &Queued{Seq: 2, PID: 7, Msg: Message{Topic: "q/2"}}) // the same pid in flight twice
		b.Enqueue("dev", &Queued{Seq: 3, PID: 8, Msg: Message{Topic: "q/3"}})
		b.SetRetained(&Message{Topic: "fine"})
	})
	path := db.Path()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	queueKeyBytes := func(id string, seq uint64) []byte { return queueKey(id, seq) }
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		puts := []struct {
			bucket []byte
			k, v   []byte
		}{
			{bucketSubs, subKey("ghost", "a/b"), []byte{0, 0, 0, 0, 0}},
			{bucketQueue, queueKeyBytes("ghost", 1), appendQueued(nil, &Queued{Msg: Message{Topic: "t"}})},
			{bucketRel, relKey("ghost", 3), nil},
			{bucketSessions, []byte("garbled"), []byte{9, 9, 9}},
			{bucketSubs, subKey("dev", "short/value"), []byte{1}},
			{bucketSubs, []byte("no-separator"), []byte{0, 0, 0, 0, 0}},
			{bucketQueue, append(sessionPrefix("dev"), 1, 2, 3), appendQueued(nil, &Queued{Msg: Message{Topic: "t"}})},
			{bucketQueue, queueKeyBytes("dev", 9), []byte{0, 1, 7, 7}},
			{bucketRel, append(sessionPrefix("dev"), 1, 2, 3), nil},
			{bucketRetained, []byte("undecodable"), []byte{0xff}},
			{bucketRetained, []byte("elsewhere"), appendMessage(nil, &Message{Topic: "somewhere/else"})},
		}
		for _, p := range puts {
			if err := tx.Bucket(p.bucket).Put(p.k, p.v); err != nil {
				return err
			}
		}
		return nil
	})
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	problems := db.Check()
	all := strings.Join(problems, "\n")
	for _, want := range []string{
		`subs: key "ghost\x00a/b" belongs to no stored session`,
		`queue: key "ghost\x00\x00\x00\x00\x00\x00\x00\x00\x01" belongs to no stored session`,
		`rel: key "ghost\x00\x00\x03" belongs to no stored session`,
		`sessions: record of "garbled" does not decode`,
		`subs: record of "dev\x00short/value" is 1 bytes, want 5`,
		`subs: key "no-separator" has no client id separator`,
		`queue: key "dev\x00\x01\x02\x03" has no 8-byte sequence`,
		`queue: record of "dev\x00\x00\x00\x00\x00\x00\x00\x00\t" does not decode`,
		`queue: session "dev" has packet identifier 7 in flight twice`,
		`rel: key "dev\x00\x01\x02\x03" has no 2-byte packet identifier`,
		`retained: record of "undecodable" does not decode`,
		`retained: record under "elsewhere" names topic "somewhere/else"`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("check did not report %s", want)
		}
	}
	if len(problems) != 12 {
		t.Errorf("%d problems, want 12:\n%s", len(problems), all)
	}
	if strings.Contains(all, "8 in flight") || strings.Contains(all, `"fine"`) {
		t.Errorf("check reported a sound record:\n%s", all)
	}
	// Load stops at the first record it cannot decode, in client id order.
	err = db.Load(func(*SessionState) error { return nil })
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), `subscription "dev\x00short/value"`) {
		t.Errorf("load: %v, want the short subscription named", err)
	}
	err = db.MatchRetained("#", func(string, string) bool { return true }, func(*Message) {})
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "undecodable") {
		t.Errorf("retained lookup: %v, want a corrupt record named", err)
	}
}

// TestCheckSchema: a file whose meta says another schema, opened read
// only so that nothing migrates it, is reported, and so is a missing
// bucket.
func TestCheckSchema(t *testing.T) {
	db := openTemp(t, Options{})
	path := db.Path()
	db.Close()
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket(bucketRel); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Put(keySchema, binary.BigEndian.AppendUint32(nil, 1))
	})
	ro, err := OpenReadOnly(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	problems := strings.Join(ro.Check(), "\n")
	for _, want := range []string{fmt.Sprintf("schema version 00000001, want %d", SchemaVersion), "bucket rel is missing"} {
		if !strings.Contains(problems, want) {
			t.Errorf("check did not report %q:\n%s", want, problems)
		}
	}
}

func TestStats(t *testing.T) {
	db := openTemp(t, Options{})
	commit(t, db, func(b *Batch) {
		for _, id := range []string{"a", "b", "c"} {
			b.PutSession(&Session{ClientID: id, Expiry: time.Minute})
			b.PutSub(id, Sub{Filter: "f/1"})
			b.PutSub(id, Sub{Filter: "f/2"})
			b.Enqueue(id, queued(1, "p"))
			b.AddAwaitingRel(id, 1)
		}
		b.SetRetained(&Message{Topic: "r", Payload: make([]byte, 100)})
		b.OutboxPut("cloud", entry(4))
		b.OutboxPut("cloud", entry(5))
		b.OutboxPut("backup", entry(1))
	})
	st, err := db.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Path != db.Path() || st.Schema != SchemaVersion || st.Sessions != 3 || st.PageSize <= 0 || st.Size < int64(4*st.PageSize) {
		t.Errorf("file stats %+v", st)
	}
	want := map[string]int{"meta": 1, "queue": 3, "rel": 3, "retained": 1, "sessions": 3, "subs": 6, "outbox": 2 + 3}
	var names []string
	for _, b := range st.Buckets {
		names = append(names, b.Name)
		if b.Keys != want[b.Name] {
			t.Errorf("bucket %s: %d keys, want %d", b.Name, b.Keys, want[b.Name])
		}
		if b.Keys > 0 && b.KeyBytes == 0 {
			t.Errorf("bucket %s: no key bytes", b.Name)
		}
	}
	if len(names) != len(allBuckets) || !slices.IsSorted(names) {
		t.Errorf("buckets %q, want all %d in order", names, len(allBuckets))
	}
	for _, b := range st.Buckets {
		if b.Name == "retained" && b.ValueBytes < 100 {
			t.Errorf("retained value bytes %d", b.ValueBytes)
		}
		if want := int64(len(appendOutbox(nil, entry(4))) + len(appendOutbox(nil, entry(5))) + len(appendOutbox(nil, entry(1)))); b.Name == "outbox" && b.ValueBytes != want {
			t.Errorf("outbox value bytes %d, want %d, its entries'", b.ValueBytes, want)
		}
	}
	wantOut := []OutboxStats{
		{Bridge: "backup", OutboxInfo: OutboxInfo{Count: 1, Bytes: int64(entry(1).Size()), FirstSeq: 1, LastSeq: 1, Oldest: entry(1).Added}},
		{Bridge: "cloud", OutboxInfo: OutboxInfo{Count: 2, Bytes: int64(entry(4).Size() + entry(5).Size()), FirstSeq: 4, LastSeq: 5, Oldest: entry(4).Added}},
	}
	if !slices.Equal(st.Outboxes, wantOut) {
		t.Errorf("outboxes %+v, want %+v", st.Outboxes, wantOut)
	}
}
