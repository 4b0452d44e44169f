package storage

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// schema1Fixture is a state file as schema 1 wrote it; regenerate with
//
//	FIELDGATE_WRITE_FIXTURE=1 go test -run TestWriteSchema1Fixture ./storage
const schema1Fixture = "testdata/schema1.db"

// schema1Retained are the retained messages in the fixture.
var schema1Retained = []Message{
	{Topic: "plant/greenhouse-1/temp", Payload: []byte(`{"value":21.5,"unit":"°C"}`), QoS: 1, Retain: true},
	{Topic: "$SYS/broker/version", Payload: []byte("fieldgate 0.1.0"), Retain: true, Expiry: 1_893_456_000_000_000_000},
}

// TestWriteSchema1Fixture writes the fixture with bbolt alone, in the
// layout schema 1 had: no rel bucket, retained records of flags (QoS in
// bits 0-1, retain in bit 2), an 8-byte expiry and the payload.
func TestWriteSchema1Fixture(t *testing.T) {
	writeFixture(t, schema1Fixture, 1, []string{"meta", "retained", "sessions", "subs", "queue"}, func(tx *bolt.Tx) error {
		for _, m := range schema1Retained {
			v := []byte{m.QoS | 4}
			v = binary.BigEndian.AppendUint64(v, uint64(m.Expiry))
			v = append(v, m.Payload...)
			if err := tx.Bucket([]byte("retained")).Put([]byte(m.Topic), v); err != nil {
				return err
			}
		}
		return nil
	})
}

// writeFixture writes a fixture of an older schema with bbolt alone: the
// buckets named, the schema version in meta, and what fill puts. It
// writes only when FIELDGATE_WRITE_FIXTURE=1.
func writeFixture(t *testing.T, fixture string, schema uint32, buckets []string, fill func(tx *bolt.Tx) error) {
	t.Helper()
	if os.Getenv("FIELDGATE_WRITE_FIXTURE") != "1" {
		t.Skip("set FIELDGATE_WRITE_FIXTURE=1 to rewrite " + fixture)
	}
	tmp := filepath.Join(t.TempDir(), filepath.Base(fixture))
	bdb, err := bolt.Open(tmp, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = bdb.Update(func(tx *bolt.Tx) error {
		for _, name := range buckets {
			if _, err := tx.CreateBucket([]byte(name)); err != nil {
				return err
			}
		}
		if err := tx.Bucket(bucketMeta).Put(keySchema, binary.BigEndian.AppendUint32(nil, schema)); err != nil {
			return err
		}
		return fill(tx)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := bdb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(fixture), 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, tmp, fixture)
	if err := os.Chmod(fixture, 0o644); err != nil {
		t.Fatal(err)
	}
}

// schema2Fixture is a state file as schema 2 wrote it; regenerate with
//
//	FIELDGATE_WRITE_FIXTURE=1 go test -run TestWriteSchema2Fixture ./storage
const schema2Fixture = "testdata/schema2.db"

// schema2Sessions are the sessions in the schema 2 fixture, with all they
// hold: a will, subscriptions, a queue with a message in flight and one
// whose PUBREC came, an identifier awaiting PUBREL.
var schema2Sessions = []SessionState{
	{
		Session: Session{ClientID: "greenhouse-1", User: "sensor", Expiry: time.Hour, Will: &Will{
			Msg: Message{Topic: "site/gh-1/status", Payload: []byte("offline"), QoS: 1, Retain: true}, Delay: 10 * time.Second,
		}},
		Subs: []Sub{{Filter: "site/all/+", Opts: 0x22}, {Filter: "site/gh-1/cmd/#", Opts: 1, ID: 3}}, // in filter order, as Load returns them
		Queue: []Queued{
			{Seq: 1, PID: 1, Msg: Message{Topic: "site/gh-1/cmd/vent", Payload: []byte("open"), QoS: 1}},
			{Seq: 2, PID: 2, Rec: true, Msg: Message{Topic: "site/gh-1/cmd/heat", Payload: []byte("18.5"), QoS: 2, Props: []byte{0x01, 0x01}}},
			{Seq: 300, Msg: Message{Topic: "site/all/time", Payload: []byte("12:00"), QoS: 1, Expiry: 1_900_000_000_000_000_000}},
		},
		AwaitingRel: []uint16{7, 513},
	},
	{
		Session: Session{ClientID: "panel", Expiry: 24 * time.Hour, ExpireAt: time.Unix(1_900_000_000, 0)},
		Subs:    []Sub{{Filter: "site/+/status"}},
	},
}

// schema2Retained are the retained messages in the schema 2 fixture.
var schema2Retained = []Message{
	{Topic: "site/gh-1/status", Payload: []byte("online"), QoS: 1, Retain: true, Props: []byte{0x03, 0x00, 0x04, 't', 'e', 'x', 't'}},
	{Topic: "site/gh-1/temp", Payload: []byte(`{"value":21.5}`), Retain: true, Expiry: 1_893_456_000_000_000_000},
}

// TestWriteSchema2Fixture writes the fixture with bbolt alone, in the
// layout schema 2 had: the buckets of schema 1 and rel, no outbox. Its
// records are encoded by this package's encoders, which schema 3 did not
// change; a schema that changes them must keep this fixture as it is.
func TestWriteSchema2Fixture(t *testing.T) {
	writeFixture(t, schema2Fixture, 2, []string{"meta", "retained", "sessions", "subs", "queue", "rel"}, func(tx *bolt.Tx) error {
		put := func(bucket string, k, v []byte) error { return tx.Bucket([]byte(bucket)).Put(k, v) }
		for _, m := range schema2Retained {
			if err := put("retained", []byte(m.Topic), appendMessage(nil, &m)); err != nil {
				return err
			}
		}
		for _, st := range schema2Sessions {
			id := st.ClientID
			if err := put("sessions", []byte(id), appendSession(nil, &st.Session)); err != nil {
				return err
			}
			for _, s := range st.Subs {
				if err := put("subs", subKey(id, s.Filter), binary.BigEndian.AppendUint32([]byte{s.Opts}, s.ID)); err != nil {
					return err
				}
			}
			for _, q := range st.Queue {
				if err := put("queue", queueKey(id, q.Seq), appendQueued(nil, &q)); err != nil {
					return err
				}
			}
			for _, pid := range st.AwaitingRel {
				if err := put("rel", relKey(id, pid), nil); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// fileSchema reads the schema version a closed state file records.
func fileSchema(t *testing.T, path string) (version uint32, buckets []string) {
	t.Helper()
	bdb, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer bdb.Close()
	_ = bdb.View(func(tx *bolt.Tx) error {
		buckets = bucketNames(tx)
		if m := tx.Bucket(bucketMeta); m != nil {
			if v := m.Get(keySchema); len(v) == 4 {
				version = binary.BigEndian.Uint32(v)
			}
		}
		return nil
	})
	return version, buckets
}

func TestSchemaNewFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "dir", "state.db")
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Dir(path)); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("directory made with %v, %v; want mode 0750", fi.Mode(), err)
	}
	st, err := db.Stats()
	if err != nil || st.Schema != SchemaVersion {
		t.Errorf("stats schema %d, %v", st.Schema, err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	v, buckets := fileSchema(t, path)
	if v != SchemaVersion {
		t.Errorf("new file has schema %d, want %d", v, SchemaVersion)
	}
	var want []string
	for _, b := range allBuckets {
		want = append(want, string(b))
	}
	slices.Sort(want)
	if !slices.Equal(buckets, want) {
		t.Errorf("buckets %q, want %q", buckets, want)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("file made with %v, %v; want mode 0600", fi.Mode(), err)
	}
}

func TestSchemaRefused(t *testing.T) {
	tests := []struct {
		name  string
		setup func(tx *bolt.Tx) error
		is    error    // what the error wraps, if anything
		says  []string // what it must mention
	}{
		{
			name: "newer schema",
			setup: func(tx *bolt.Tx) error {
				if _, err := tx.CreateBucket(bucketMeta); err != nil {
					return err
				}
				return tx.Bucket(bucketMeta).Put(keySchema, binary.BigEndian.AppendUint32(nil, SchemaVersion+1))
			},
			is:   ErrNewerSchema,
			says: []string{fmt.Sprintf("schema %d", SchemaVersion+1), fmt.Sprintf("up to %d", SchemaVersion), "newer fieldgate"},
		},
		{
			name: "schema from a far future",
			setup: func(tx *bolt.Tx) error {
				if _, err := tx.CreateBucket(bucketMeta); err != nil {
					return err
				}
				return tx.Bucket(bucketMeta).Put(keySchema, []byte{0xff, 0xff, 0xff, 0xff})
			},
			is:   ErrNewerSchema,
			says: []string{"schema 4294967295"},
		},
		{
			name: "another program's bbolt file",
			setup: func(tx *bolt.Tx) error {
				_, err := tx.CreateBucket([]byte("widgets"))
				return err
			},
			says: []string{"widgets", "no meta bucket", "not written by fieldgate"},
		},
		{
			name: "meta bucket without a version",
			setup: func(tx *bolt.Tx) error {
				_, err := tx.CreateBucket(bucketMeta)
				return err
			},
			says: []string{"no schema version", "not written by fieldgate"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			rawUpdate(t, path, tc.setup)
			before, _ := os.ReadFile(path)
			db, err := Open(path, Options{})
			if err == nil {
				db.Close()
				t.Fatal("opened")
			}
			if tc.is != nil {
				errIs(t, err, tc.is)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name the file", err)
			}
			// Refusing must leave the file as it was.
			if after, _ := os.ReadFile(path); string(after) != string(before) {
				t.Error("refusing the file changed it")
			}
			// And the lock must be gone: bbolt can open it again at once.
			bdb, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 100 * time.Millisecond})
			if err != nil {
				t.Fatalf("file still locked after a refused open: %v", err)
			}
			bdb.Close()
		})
	}
}

func TestSchemaMigrate1(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	copyFile(t, schema1Fixture, path)
	if v, buckets := fileSchema(t, path); v != 1 || strings.Contains(strings.Join(buckets, ","), "rel") {
		t.Fatalf("fixture has schema %d and buckets %q; want schema 1 without rel", v, buckets)
	}
	for range 2 { // the second open finds it migrated already
		db, err := Open(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range schema1Retained {
			want := &schema1Retained[i]
			got, err := db.Retained(want.Topic)
			if err != nil {
				t.Fatal(err)
			}
			if d := sameMessage(got, want); d != "" {
				t.Errorf("%s: %s", want.Topic, d)
			}
		}
		if n := db.RetainedCount(); n != len(schema1Retained) {
			t.Errorf("%d retained, want %d", n, len(schema1Retained))
		}
		if problems := db.Check(); len(problems) > 0 {
			t.Errorf("check after migration: %q", problems)
		}
		// The rel bucket works.
		commit(t, db, func(b *Batch) {
			b.PutSession(&Session{ClientID: "c"})
			b.AddAwaitingRel("c", 7)
		})
		if st := loadAll(t, db)["c"]; st == nil || len(st.AwaitingRel) != 1 {
			t.Errorf("awaiting PUBREL after migration: %+v", st)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		if v, buckets := fileSchema(t, path); v != SchemaVersion || !slices.Contains(buckets, "rel") || !slices.Contains(buckets, "outbox") {
			t.Fatalf("migrated file has schema %d and buckets %q", v, buckets)
		}
	}
}

// TestSchemaMigrate1Damaged: a schema 1 record too short to hold its
// header fails the migration, which leaves the file as it was.
func TestSchemaMigrate1Damaged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	copyFile(t, schema1Fixture, path)
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRetained).Put([]byte("short"), []byte{1, 2})
	})
	db, err := Open(path, Options{})
	if err == nil {
		db.Close()
		t.Fatal("opened")
	}
	errIs(t, err, ErrCorrupt)
	for _, s := range []string{"from schema 1 to 2", "short"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	if v, _ := fileSchema(t, path); v != 1 {
		t.Errorf("failed migration left schema %d", v)
	}
}

func TestSchemaMigrate2(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	copyFile(t, schema2Fixture, path)
	if v, buckets := fileSchema(t, path); v != 2 || slices.Contains(buckets, "outbox") || !slices.Contains(buckets, "rel") {
		t.Fatalf("fixture has schema %d and buckets %q; want schema 2 with rel, without outbox", v, buckets)
	}
	for round := range 2 { // the second open finds it migrated already
		db, err := Open(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		all := loadAll(t, db)
		if len(all) != len(schema2Sessions) {
			t.Errorf("%d sessions, want %d", len(all), len(schema2Sessions))
		}
		for i := range schema2Sessions {
			want := &schema2Sessions[i]
			got := all[want.ClientID]
			if got == nil {
				t.Fatalf("session %q lost", want.ClientID)
			}
			sameSession(t, &got.Session, &want.Session)
			if !slices.Equal(got.Subs, want.Subs) || !slices.Equal(got.AwaitingRel, want.AwaitingRel) || len(got.Queue) != len(want.Queue) {
				t.Fatalf("%s: subs %+v rel %v queue %v; want %+v %v %v", want.ClientID, got.Subs, got.AwaitingRel, seqs(got.Queue), want.Subs, want.AwaitingRel, seqs(want.Queue))
			}
			for j, q := range want.Queue {
				g := got.Queue[j]
				if g.Seq != q.Seq || g.PID != q.PID || g.Rec != q.Rec || sameMessage(&g.Msg, &q.Msg) != "" {
					t.Errorf("%s: queued %+v, want %+v", want.ClientID, g, q)
				}
			}
		}
		for i := range schema2Retained {
			want := &schema2Retained[i]
			got, err := db.Retained(want.Topic)
			if err != nil {
				t.Fatal(err)
			}
			if d := sameMessage(got, want); d != "" {
				t.Errorf("%s: %s", want.Topic, d)
			}
		}
		if db.QueuedBytes() == 0 {
			t.Error("queued bytes of the migrated queues not counted")
		}
		if problems := db.Check(); len(problems) > 0 {
			t.Errorf("check after migration: %q", problems)
		}
		// The outbox works, and what the first round put is there in the
		// second.
		if info, err := db.OutboxInfo("cloud"); err != nil || info.Count != round {
			t.Errorf("round %d: outbox %+v, %v", round, info, err)
		}
		commit(t, db, func(b *Batch) { b.OutboxPut("cloud", entry(uint64(round+1))) })
		if s := scanSeqs(t, db, "cloud", 0, 0); len(s) != round+1 {
			t.Errorf("round %d: outbox holds %v", round, s)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		if v, buckets := fileSchema(t, path); v != SchemaVersion || !slices.Contains(buckets, "outbox") {
			t.Fatalf("migrated file has schema %d and buckets %q", v, buckets)
		}
	}
}

// TestSchema2ReadOnly: a schema 2 file opened read only (fieldgate db
// check on a file an older build wrote) is not migrated; the outbox reads
// find no outbox, and Check says what is missing.
func TestSchema2ReadOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	copyFile(t, schema2Fixture, path)
	ro, err := OpenReadOnly(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if names, err := ro.OutboxBridges(); err != nil || names != nil {
		t.Errorf("bridges %q, %v", names, err)
	}
	if info, err := ro.OutboxInfo("cloud"); err != nil || info != (OutboxInfo{}) {
		t.Errorf("info %+v, %v", info, err)
	}
	if s := scanSeqs(t, ro, "cloud", 0, 0); s != nil {
		t.Errorf("scan %v", s)
	}
	if st, err := ro.Stats(); err != nil || st.Outboxes != nil {
		t.Errorf("stats outboxes %+v, %v", st.Outboxes, err)
	}
	problems := strings.Join(ro.Check(), "\n")
	for _, want := range []string{fmt.Sprintf("schema version 00000002, want %d", SchemaVersion), "bucket outbox is missing"} {
		if !strings.Contains(problems, want) {
			t.Errorf("check did not report %q:\n%s", want, problems)
		}
	}
	if v, _ := fileSchema(t, path); v != 2 {
		t.Errorf("read-only open left schema %d", v)
	}
}
