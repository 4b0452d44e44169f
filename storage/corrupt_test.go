package storage

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
	bolt "go.etcd.io/bbolt"
)

// sample is a closed state file with a few pages of every kind of record,
// and what it holds.
type sample struct {
	path     string
	data     []byte
	pageSize int
	hwm      int64 // bytes below bbolt's high water mark
	content  string
}

func makeSample(t *testing.T) *sample {
	t.Helper()
	db := openTemp(t, Options{})
	r := rand.New(rand.NewPCG(3, 4))
	payload := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte('a' + r.IntN(26))
		}
		return b
	}
	for i := range 40 {
		id := fmt.Sprintf("dev%02d", i)
		commit(t, db, func(b *Batch) {
			s := Session{ClientID: id, Expiry: time.Hour}
			if i%3 == 0 {
				s.Will = &Will{Msg: Message{Topic: id + "/status", Payload: []byte("offline")}, Delay: time.Second}
			}
			b.PutSession(&s)
			b.PutSub(id, Sub{Filter: id + "/cmd/#", Opts: 1})
			for q := range 5 {
				b.Enqueue(id, &Queued{Seq: uint64(q), PID: uint16(q), Msg: Message{Topic: id + "/q", Payload: payload(100), QoS: 1}})
			}
			b.AddAwaitingRel(id, uint16(i+1))
			for k := range 10 {
				b.SetRetained(&Message{Topic: fmt.Sprintf("plant/%s/s%d", id, k), Payload: payload(150), Retain: true})
			}
			// A bridge's outbox of a few pages, and one small enough for
			// bbolt to keep inline in its parent's page.
			for k := range 3 {
				seq := uint64(3*i + k + 1)
				b.OutboxPut("cloud", &OutboxEntry{Seq: seq, Route: uint16(k), Added: int64(seq) << 20, Msg: Message{Topic: "up/" + id, Payload: payload(120), QoS: 1}})
			}
		})
	}
	commit(t, db, func(b *Batch) {
		b.OutboxPut("backup", &OutboxEntry{Seq: 1, Added: 1, Msg: Message{Topic: "up/x", Payload: payload(10)}})
	})
	s := &sample{path: db.Path(), pageSize: db.bolt.Info().PageSize}
	_ = db.bolt.View(func(tx *bolt.Tx) error { s.hwm = tx.Size(); return nil })
	s.content = dump(t, db)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	var err error
	if s.data, err = os.ReadFile(s.path); err != nil {
		t.Fatal(err)
	}
	return s
}

// dump renders everything a DB holds, for comparing two of them.
func dump(t *testing.T, db *DB) string {
	t.Helper()
	var b strings.Builder
	err := db.Load(func(st *SessionState) error {
		fmt.Fprintf(&b, "%q %q %v %d subs %+v rel %v\n", st.ClientID, st.User, st.Expiry, st.ExpireAt.UnixNano(), st.Subs, st.AwaitingRel)
		if w := st.Will; w != nil {
			fmt.Fprintf(&b, "  will %v %d %+v\n", w.Delay, w.At.UnixNano(), w.Msg)
		}
		for _, q := range st.Queue {
			fmt.Fprintf(&b, "  %+v\n", q)
		}
		return nil
	})
	if err != nil {
		return "load: " + err.Error()
	}
	err = db.MatchRetained("#", func(string, string) bool { return true }, func(m *Message) {
		fmt.Fprintf(&b, "%+v\n", *m)
	})
	if err != nil {
		return "retained: " + err.Error()
	}
	names, err := db.OutboxBridges()
	if err != nil {
		return "outbox bridges: " + err.Error()
	}
	for _, name := range names {
		fmt.Fprintf(&b, "outbox %q\n", name)
		err := db.OutboxScan(name, 0, 0, func(e *OutboxEntry) bool {
			fmt.Fprintf(&b, "  %+v\n", *e)
			return true
		})
		if err != nil {
			return "outbox scan: " + err.Error()
		}
	}
	return b.String()
}

// outcome is what became of a damaged file.
type outcome string

const (
	refused   outcome = "refused at open"
	found     outcome = "opened, problems found"
	unchanged outcome = "opened, content unchanged"
	undetect  outcome = "opened, content changed undetected"
)

// probe opens a possibly damaged file and uses it every way it can be
// used. Nothing may panic; errors from reads must wrap ErrCorrupt.
func probe(t *testing.T, path, want string) (out outcome, detail string) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("%s: panic: %v\n%s", path, r, debug.Stack())
		}
	}()
	db, err := Open(path, Options{LockTimeout: time.Second})
	if err != nil {
		return refused, err.Error()
	}
	defer func() {
		if err := db.Close(); err != nil {
			t.Logf("close: %v", err)
		}
	}()
	problems := db.Check()
	var readErrs []string
	for what, err := range map[string]error{
		"load":           db.Load(func(*SessionState) error { return nil }),
		"match":          db.MatchRetained("plant/#", func(string, string) bool { return true }, func(*Message) {}),
		"get":            func() error { _, err := db.Retained("plant/dev07/s3"); return err }(),
		"stats":          func() error { _, err := db.Stats(); return err }(),
		"outbox scan":    db.OutboxScan("cloud", 0, 0, func(*OutboxEntry) bool { return true }),
		"outbox info":    func() error { _, err := db.OutboxInfo("cloud"); return err }(),
		"outbox bridges": func() error { _, err := db.OutboxBridges(); return err }(),
		"dead letters":   db.DeadLetterScan("cloud", 0, 0, func(*DeadLetter) bool { return true }),
		"dead info":      func() error { _, err := db.DeadLetterInfo("cloud"); return err }(),
		"dead newest":    func() error { _, err := db.DeadLetterNewest("cloud", 5); return err }(),
	} {
		if err == nil {
			continue
		}
		if what != "stats" && !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %s error does not wrap ErrCorrupt: %v", path, what, err)
		}
		readErrs = append(readErrs, what+": "+err.Error())
	}
	content := dump(t, db)

	// Writing to a damaged file may fail or not; it must not panic, hang
	// or stop the committer.
	done := make(chan error, 1)
	var b Batch
	b.SetRetained(&Message{Topic: "after/damage", Payload: []byte("x")})
	db.Commit(&b, func(err error) { done <- err })
	select {
	case <-done:
	case <-time.After(testkit.Scale(20 * time.Second)):
		t.Fatalf("%s: commit on a damaged file never completed", path)
	}

	switch {
	case len(problems) > 0 || len(readErrs) > 0:
		return found, strings.Join(append(problems, readErrs...), "; ")
	case content == want:
		return unchanged, ""
	default:
		return undetect, ""
	}
}

func TestCorruptTruncated(t *testing.T) {
	s := makeSample(t)
	size := int64(len(s.data))
	t.Logf("sample: %d bytes, %d below the high water mark, %d-byte pages", size, s.hwm, s.pageSize)
	cuts := []int64{1, 100, 4095, 4096, 6000, 8192, 12_000, 16_384, 20_000, s.hwm / 2, s.hwm - int64(s.pageSize), s.hwm - 1, s.hwm, size - 1}
	for _, cut := range cuts {
		if cut <= 0 || cut > size {
			continue
		}
		t.Run(fmt.Sprint(cut), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			if err := os.WriteFile(path, s.data[:cut], 0o600); err != nil {
				t.Fatal(err)
			}
			out, detail := probe(t, path, s.content)
			t.Logf("%s %s", out, detail)
			switch {
			case cut < s.hwm && out != refused:
				t.Errorf("cut to %d of %d bytes: %s, want refused at open", cut, s.hwm, out)
			case cut < s.hwm && !strings.Contains(detail, "damaged"):
				t.Errorf("refused without saying the file is damaged: %s", detail)
			case cut >= s.hwm && out != unchanged:
				// The tail past the high water mark is bbolt's room to grow.
				t.Errorf("cut at %d, past the data: %s %s", cut, out, detail)
			}
		})
	}
}

func TestCorruptBitFlips(t *testing.T) {
	s := makeSample(t)
	seed, n := uint64(5), 300
	if testing.Short() {
		n = 60
	}
	// FIELDGATE_CORRUPT_ROUNDS=10000 (and a seed) for a longer search.
	if v, err := strconv.Atoi(os.Getenv("FIELDGATE_CORRUPT_ROUNDS")); err == nil {
		n, seed = v, uint64(time.Now().UnixNano())
		t.Logf("seed %d", seed)
	}
	r := rand.New(rand.NewPCG(seed, 6))
	counts := map[outcome]int{}
	dir := t.TempDir()
	for i := range n {
		b := bytes.Clone(s.data)
		// Data pages only: the meta pages carry a checksum, and bbolt
		// falls back to the other one.
		data := func() int64 { return int64(2*s.pageSize) + r.Int64N(s.hwm-int64(2*s.pageSize)) }
		var damage string
		if i%4 == 3 {
			// A sector of zeros or of garbage, as a failing SD card
			// returns one.
			off, zero := data()&^511, r.IntN(2) == 0
			for j := off; j < off+512; j++ {
				if b[j] = 0; !zero {
					b[j] = byte(r.Uint32())
				}
			}
			damage = fmt.Sprintf("sector at %d (zeros %t)", off, zero)
		} else {
			flips := 1 + r.IntN(8)
			for range flips {
				b[data()] ^= 1 << r.IntN(8)
			}
			damage = fmt.Sprintf("%d flips", flips)
		}
		path := filepath.Join(dir, fmt.Sprintf("flip%03d.db", i))
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		out, detail := probe(t, path, s.content)
		counts[out]++
		if testing.Verbose() && out != unchanged {
			t.Logf("%s: %s %.300s", damage, out, detail)
		}
		os.Remove(path)
	}
	t.Logf("%d damaged files: %v", n, counts)
	if counts[refused]+counts[found] == 0 {
		t.Error("no damage detected at all")
	}
	// bbolt keeps no checksum of data pages: a flip inside a payload (or
	// a key that stays in order) reads back as different data. Counted,
	// not failed; the checks above make sure it never panics.
	if counts[undetect] > 0 {
		t.Logf("%d of %d files changed without detection (flips inside record data)", counts[undetect], n)
	}
}

// TestCorruptStructure damages the page headers bbolt navigates by: the
// file must be refused or reported, never read as sound.
func TestCorruptStructure(t *testing.T) {
	s := makeSample(t)
	ps := int64(s.pageSize)
	var targets []int64
	for off := 2 * ps; off < s.hwm; off += ps {
		targets = append(targets, off)
	}
	counts := map[outcome]int{}
	for _, field := range []struct {
		name string
		at   int64 // offset in the page header
		val  byte
	}{
		{"page id", 0, 0x5a},
		{"flags", 8, 0xee},
		{"count", 10, 0xff},
		{"overflow", 12, 0x7f},
	} {
		t.Run(field.name, func(t *testing.T) {
			for _, page := range targets {
				b := bytes.Clone(s.data)
				b[page+field.at] = field.val
				path := filepath.Join(t.TempDir(), "state.db")
				if err := os.WriteFile(path, b, 0o600); err != nil {
					t.Fatal(err)
				}
				out, _ := probe(t, path, s.content)
				counts[out]++
				// A changed header of a free page harms nothing.
				if out == undetect {
					t.Errorf("page %d: %s of its header changed, content changed undetected", page/ps, field.name)
				}
			}
		})
	}
	t.Logf("%d damaged page headers: %v", 4*len(targets), counts)
	if counts[refused]+counts[found] == 0 {
		t.Error("no damaged header detected")
	}
}

func TestCorruptGarbage(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 9))
	random := make([]byte, 64<<10)
	for i := range random {
		random[i] = byte(r.Uint32())
	}
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"random", random},
		{"zeros", make([]byte, 64<<10)},
		{"text", bytes.Repeat([]byte("storage:\n  path: /var/lib/fieldgate/state.db\n"), 1000)},
		{"short", []byte("x")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			if err := os.WriteFile(path, tc.b, 0o600); err != nil {
				t.Fatal(err)
			}
			if out, detail := probe(t, path, ""); out != refused {
				t.Errorf("%s: %s", out, detail)
			} else if !strings.Contains(detail, path) {
				t.Errorf("error %q does not name the file", detail)
			}
		})
	}
}

func TestLocked(t *testing.T) {
	db := openTemp(t, Options{})
	const timeout = 200 * time.Millisecond
	start := time.Now()
	db2, err := Open(db.Path(), Options{LockTimeout: timeout})
	took := time.Since(start)
	if err == nil {
		db2.Close()
		t.Fatal("a second open of a file in use succeeded")
	}
	if !strings.Contains(err.Error(), "another process") || !strings.Contains(err.Error(), db.Path()) {
		t.Errorf("error %q does not say another process holds the file", err)
	}
	// bbolt retries the lock every 50ms and stops one retry short.
	if took < timeout/2 || took > timeout+2*time.Second {
		t.Errorf("gave up after %v with a lock timeout of %v", took, timeout)
	}
	// The first one still works, and once it is closed the file opens.
	commit(t, db, func(b *Batch) { b.SetRetained(&Message{Topic: "still", Payload: []byte("ok")}) })
	db = reopen(t, db, Options{LockTimeout: timeout})
	if m, _ := db.Retained("still"); m == nil {
		t.Error("commit lost")
	}
}

func TestOpenReadOnly(t *testing.T) {
	db := openTemp(t, Options{})
	commit(t, db, func(b *Batch) {
		b.PutSession(&Session{ClientID: "c"})
		b.SetRetained(&Message{Topic: "t", Payload: []byte("v")})
	})
	path := db.Path()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	ro, err := OpenReadOnly(path)
	if err != nil {
		t.Fatal(err)
	}
	if problems := ro.Check(); len(problems) > 0 {
		t.Errorf("check: %q", problems)
	}
	if st, err := ro.Stats(); err != nil || st.Sessions != 1 {
		t.Errorf("stats: %+v, %v", st, err)
	}
	var ids []string
	err = ro.Load(func(st *SessionState) error { ids = append(ids, st.ClientID); return nil })
	if err != nil || !slices.Equal(ids, []string{"c"}) {
		t.Errorf("load: %q, %v", ids, err)
	}
	var b Batch
	b.DeleteRetained("t")
	errIs(t, ro.CommitWait(&b), ErrClosed)
	if err := ro.Close(); err != nil {
		t.Fatal(err)
	}
	// Closed means unlocked: the gateway can start.
	db, err = Open(path, Options{LockTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("open after a read-only close: %v", err)
	}
	db.Close()
	if _, err := OpenReadOnly(filepath.Join(t.TempDir(), "missing.db")); err == nil {
		t.Error("read-only open of a missing file succeeded")
	}
}

// TestCorruptFatalShapes plants the damage bbolt cannot survive at all,
// neither by recover nor by fault handling: a branch page that names its
// own ancestor, a record flagged as a bucket whose root is the page above
// it (both loop until the stack or heap is gone), an overflow count of
// billions of pages, and a freelist that claims billions of ids (both
// exhaust the heap on the first write). Open must refuse each.
func TestCorruptFatalShapes(t *testing.T) {
	s := makeSample(t)
	ps := int64(s.pageSize)

	// The retained bucket's root page, a branch page at this size, and
	// the meta page bbolt uses, read with bbolt itself.
	var retainedRoot, freelist int64
	bdb, err := bolt.Open(s.path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = bdb.View(func(tx *bolt.Tx) error {
		retainedRoot = int64(tx.Bucket(bucketRetained).Root())
		return nil
	})
	bdb.Close()
	for m := range int64(2) {
		meta := s.data[m*ps+16:]
		if best := s.data[16:]; m == 0 || native.Uint64(meta[48:]) > native.Uint64(best[48:]) {
			freelist = int64(native.Uint64(meta[32:]))
		}
	}
	branch := s.data[retainedRoot*ps:]
	if native.Uint16(branch[8:]) != pageBranch {
		t.Fatalf("retained root page %d is not a branch page; the sample needs more records", retainedRoot)
	}
	firstLeaf := int64(native.Uint64(branch[16+8:]))

	for _, tc := range []struct {
		name   string
		damage func(b []byte)
	}{
		{"branch names its ancestor", func(b []byte) {
			native.PutUint64(b[retainedRoot*ps+16+8:], uint64(retainedRoot))
		}},
		{"record turned bucket names the page above", func(b []byte) {
			leaf := b[firstLeaf*ps:]
			native.PutUint32(leaf[16:], 1) // element 0: bucket flag
			pos, ksize := native.Uint32(leaf[16+4:]), native.Uint32(leaf[16+8:])
			native.PutUint64(leaf[16+int(pos)+int(ksize):], uint64(retainedRoot))
		}},
		{"record turned bucket names a free page", func(b []byte) {
			// A free page keeps the header of its last use; the next write
			// may reuse it for a page above the record.
			fl := b[freelist*ps:]
			if native.Uint16(fl[10:]) == 0 {
				t.Skip("the sample has no free page")
			}
			leaf := b[firstLeaf*ps:]
			native.PutUint32(leaf[16:], 1)
			pos, ksize := native.Uint32(leaf[16+4:]), native.Uint32(leaf[16+8:])
			native.PutUint64(leaf[16+int(pos)+int(ksize):], native.Uint64(fl[16:]))
		}},
		{"overflow of billions", func(b []byte) {
			native.PutUint32(b[firstLeaf*ps+12:], 0x7fff_ffff)
		}},
		{"freelist of billions", func(b []byte) {
			p := b[freelist*ps:]
			native.PutUint16(p[10:], 0xFFFF)
			native.PutUint64(p[16:], 1<<34)
		}},
		{"freelist names a page past the end", func(b []byte) {
			p := b[freelist*ps:]
			native.PutUint16(p[10:], 1)
			native.PutUint64(p[16:], uint64(s.hwm/ps)+5)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := bytes.Clone(s.data)
			tc.damage(b)
			path := filepath.Join(t.TempDir(), "state.db")
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			out, detail := probe(t, path, s.content)
			if out != refused {
				t.Fatalf("%s %s", out, detail)
			}
			t.Log(detail)
		})
	}
}
