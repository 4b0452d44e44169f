package storage

import (
	"encoding/binary"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// flights returns bridge's flight records and fails on an error.
func flights(t testing.TB, db *DB, bridge string) ([]OutboxFlight, int) {
	t.Helper()
	set, err := db.OutboxFlights(bridge)
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Flights) > 0 && !set.Tracked {
		t.Errorf("%s has records but is not tracked", bridge)
	}
	return set.Flights, set.Bad
}

func TestOutboxFlightsPutDelete(t *testing.T) {
	db := openTemp(t, Options{})
	if got, bad := flights(t, db, "cloud"); got != nil || bad != 0 {
		t.Fatalf("new file: %+v, %d bad", got, bad)
	}
	commit(t, db, func(b *Batch) {
		for seq := uint64(1); seq <= 6; seq++ {
			b.OutboxPut("cloud", entry(seq))
			b.OutboxPut("backup", entry(seq))
		}
		b.OutboxFlightPut("cloud", &OutboxFlight{Seq: 2, PID: 7, Stamp: 1})
		b.OutboxFlightPut("cloud", &OutboxFlight{Seq: 3, PID: 65535, Stamp: 2})
		b.OutboxFlightPut("cloud", &OutboxFlight{Seq: 5, PID: 9, Stamp: 3})
		b.OutboxFlightPut("backup", &OutboxFlight{Seq: 2, PID: 7, Stamp: 1})
	})
	// A put replaces the record; the stage and stamp come back as written.
	commit(t, db, func(b *Batch) {
		b.OutboxFlightPut("cloud", &OutboxFlight{Seq: 3, PID: 65535, Released: true, Stamp: 1 << 40})
	})
	want := []OutboxFlight{{Seq: 2, PID: 7, Stamp: 1}, {Seq: 3, PID: 65535, Released: true, Stamp: 1 << 40}, {Seq: 5, PID: 9, Stamp: 3}}
	if got, bad := flights(t, db, "cloud"); !slices.Equal(got, want) || bad != 0 {
		t.Fatalf("cloud: %+v (%d bad), want %+v", got, bad, want)
	}
	// Deleting an outbox entry deletes its record, in the same write;
	// deleting the record leaves the entry.
	commit(t, db, func(b *Batch) {
		b.OutboxDelete("cloud", 2)
		b.OutboxFlightDelete("cloud", 5)
		b.OutboxFlightDelete("cloud", 99)  // absent
		b.OutboxFlightDelete("nowhere", 1) // no such bridge
	})
	db = reopen(t, db, Options{})
	if got, _ := flights(t, db, "cloud"); !slices.Equal(got, want[1:2]) {
		t.Errorf("cloud after deletes: %+v, want %+v", got, want[1:2])
	}
	if s := scanSeqs(t, db, "cloud", 0, 0); !slices.Equal(s, []uint64{1, 3, 4, 5, 6}) {
		t.Errorf("cloud outbox after deletes: %v", s)
	}
	if got, _ := flights(t, db, "backup"); len(got) != 1 || got[0].Seq != 2 {
		t.Errorf("backup, untouched: %+v", got)
	}
	// Dropping an outbox drops its records; the bridges listed are the
	// outboxes, never the record buckets.
	commit(t, db, func(b *Batch) { b.OutboxDrop("backup") })
	if got, _ := flights(t, db, "backup"); got != nil {
		t.Errorf("dropped bridge keeps records %+v", got)
	}
	if b := bridges(t, db); !slices.Equal(b, []string{"cloud"}) {
		t.Errorf("bridges %q", b)
	}
	if p := db.Check(); len(p) > 0 {
		t.Errorf("check: %q", p)
	}
}

// TestOutboxFlightsDamaged: records that do not decode are counted, left
// out, and reported by Check; a delete of their entry removes them.
func TestOutboxFlightsDamaged(t *testing.T) {
	db := openTemp(t, Options{})
	commit(t, db, func(b *Batch) {
		for seq := uint64(1); seq <= 4; seq++ {
			b.OutboxPut("cloud", entry(seq))
		}
		b.OutboxFlightPut("cloud", &OutboxFlight{Seq: 1, PID: 1, Stamp: 1})
	})
	path := db.Path()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		bb := tx.Bucket(bucketUpflight).Bucket([]byte("cloud"))
		good := bb.Get(binary.BigEndian.AppendUint64(nil, 1))
		for k, v := range map[uint64][]byte{
			2: good[:5],                                                     // short
			3: append([]byte{0, 0}, good[2:]...),                            // packet id 0
			4: append(slices.Clone(good[:2]), 0x80, 0, 0, 0, 0, 0, 0, 0, 0), // unknown flags
		} {
			if err := bb.Put(binary.BigEndian.AppendUint64(nil, k), v); err != nil {
				return err
			}
		}
		return bb.Put([]byte("x"), good) // no sequence
	})
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	got, bad := flights(t, db, "cloud")
	if len(got) != 1 || got[0].Seq != 1 || bad != 4 {
		t.Errorf("damaged: %+v, %d bad; want seq 1 and 4 bad", got, bad)
	}
	problems := strings.Join(db.Check(), "\n")
	for _, want := range []string{`upflight "cloud": record under key "x"`, `upflight "cloud": record under key "\x00\x00\x00\x00\x00\x00\x00\x03"`} {
		if !strings.Contains(problems, want) {
			t.Errorf("check did not report %q:\n%s", want, problems)
		}
	}
	commit(t, db, func(b *Batch) {
		for seq := uint64(2); seq <= 4; seq++ {
			b.OutboxDelete("cloud", seq)
		}
	})
	if _, bad := flights(t, db, "cloud"); bad != 1 {
		t.Errorf("%d bad after deleting their entries, want the one with no sequence", bad)
	}
}

// schema3Fixture is a state file as schema 3 wrote it; regenerate with
//
//	FIELDGATE_WRITE_FIXTURE=1 go test -run TestWriteSchema3Fixture ./storage
const schema3Fixture = "testdata/schema3.db"

// TestWriteSchema3Fixture writes the fixture with bbolt alone, in the
// layout schema 3 had: schema 2's buckets and records and an outbox, no
// upflight bucket.
func TestWriteSchema3Fixture(t *testing.T) {
	writeFixture(t, schema3Fixture, 3, []string{"meta", "retained", "sessions", "subs", "queue", "rel", "outbox"}, func(tx *bolt.Tx) error {
		for _, m := range schema2Retained {
			if err := tx.Bucket(bucketRetained).Put([]byte(m.Topic), appendMessage(nil, &m)); err != nil {
				return err
			}
		}
		bb, err := tx.Bucket(bucketOutbox).CreateBucket([]byte("cloud"))
		if err != nil {
			return err
		}
		for seq := uint64(1); seq <= 5; seq++ {
			if err := bb.Put(binary.BigEndian.AppendUint64(nil, seq), appendOutbox(nil, entry(seq))); err != nil {
				return err
			}
		}
		return nil
	})
}

func TestSchemaMigrate3(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	copyFile(t, schema3Fixture, path)
	if v, buckets := fileSchema(t, path); v != 3 || slices.Contains(buckets, "upflight") || !slices.Contains(buckets, "outbox") {
		t.Fatalf("fixture has schema %d and buckets %q; want schema 3 with outbox, without upflight", v, buckets)
	}
	// Read only, the file is not migrated: there are no records, and
	// Check says what is missing.
	ro, err := OpenReadOnly(path)
	if err != nil {
		t.Fatal(err)
	}
	if set, err := ro.OutboxFlights("cloud"); set.Flights != nil || set.Bad != 0 || set.Tracked || err != nil {
		t.Errorf("read-only schema 3: %+v, %v", set, err)
	}
	problems := strings.Join(ro.Check(), "\n")
	for _, want := range []string{"bucket upflight is missing"} {
		if !strings.Contains(problems, want) {
			t.Errorf("check did not report %q:\n%s", want, problems)
		}
	}
	ro.Close()
	for round := range 2 { // the second open finds it migrated already
		db, err := Open(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		all, err := scanAll(t, db, "cloud", 0, 0)
		if err != nil || len(all) != 5-round {
			t.Fatalf("round %d: outbox %d entries, %v", round, len(all), err)
		}
		for _, e := range all {
			if d := sameEntry(e, entry(e.Seq)); d != "" {
				t.Error(d)
			}
		}
		if p := db.Check(); len(p) > 0 {
			t.Errorf("check after migration: %q", p)
		}
		if round == 0 {
			commit(t, db, func(b *Batch) {
				b.OutboxFlightPut("cloud", &OutboxFlight{Seq: 4, PID: 4, Stamp: 1})
				b.OutboxFlightPut("cloud", &OutboxFlight{Seq: 5, PID: 5, Stamp: 2})
				b.OutboxDelete("cloud", 5)
			})
		} else if got, _ := flights(t, db, "cloud"); len(got) != 1 || got[0] != (OutboxFlight{Seq: 4, PID: 4, Stamp: 1}) {
			t.Errorf("records after reopening: %+v", got)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		if v, buckets := fileSchema(t, path); v != SchemaVersion || !slices.Contains(buckets, "upflight") {
			t.Fatalf("migrated file has schema %d and buckets %q", v, buckets)
		}
	}
}

// TestOutboxFlightsTracked: a bridge is tracked from OutboxFlightsOpen (or
// its first record) until its outbox is dropped.
func TestOutboxFlightsTracked(t *testing.T) {
	db := openTemp(t, Options{})
	tracked := func() bool {
		t.Helper()
		set, err := db.OutboxFlights("cloud")
		if err != nil {
			t.Fatal(err)
		}
		return set.Tracked
	}
	if tracked() {
		t.Fatal("new file: tracked")
	}
	commit(t, db, func(b *Batch) { b.OutboxFlightsOpen("cloud"); b.OutboxFlightsOpen("cloud") })
	db = reopen(t, db, Options{})
	if !tracked() {
		t.Error("not tracked after OutboxFlightsOpen")
	}
	commit(t, db, func(b *Batch) { b.OutboxDrop("cloud") })
	if tracked() {
		t.Error("tracked after OutboxDrop")
	}
	commit(t, db, func(b *Batch) { b.OutboxFlightPut("cloud", &OutboxFlight{Seq: 1, PID: 1}) })
	if !tracked() {
		t.Error("not tracked after a record")
	}
	if b := bridges(t, db); b != nil {
		t.Errorf("a record makes no outbox: bridges %q", b)
	}
}
