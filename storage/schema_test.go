package storage

import (
	"encoding/binary"
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
	if os.Getenv("FIELDGATE_WRITE_FIXTURE") != "1" {
		t.Skip("set FIELDGATE_WRITE_FIXTURE=1 to rewrite " + schema1Fixture)
	}
	tmp := filepath.Join(t.TempDir(), "schema1.db")
	bdb, err := bolt.Open(tmp, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = bdb.Update(func(tx *bolt.Tx) error {
		for _, name := range []string{"meta", "retained", "sessions", "subs", "queue"} {
			if _, err := tx.CreateBucket([]byte(name)); err != nil {
				return err
			}
		}
		if err := tx.Bucket([]byte("meta")).Put([]byte("schema"), binary.BigEndian.AppendUint32(nil, 1)); err != nil {
			return err
		}
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
	if err != nil {
		t.Fatal(err)
	}
	if err := bdb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(schema1Fixture), 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, tmp, schema1Fixture)
	if err := os.Chmod(schema1Fixture, 0o644); err != nil {
		t.Fatal(err)
	}
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
			says: []string{"schema 3", "up to 2", "newer fieldgate"},
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
		if v, buckets := fileSchema(t, path); v != SchemaVersion || !strings.Contains(strings.Join(buckets, ","), "rel") {
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
