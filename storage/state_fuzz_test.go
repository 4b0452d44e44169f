package storage

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// fuzzStateFile writes a small state file with a record of every kind, a
// few pages of them, and returns its bytes: the seed the fuzzer damages.
func fuzzStateFile(f *testing.F) []byte {
	db := openTemp(f, Options{})
	for i := range 6 {
		id := fmt.Sprintf("dev%d", i)
		commit(f, db, func(b *Batch) {
			s := Session{ClientID: id, User: "u", Expiry: time.Hour, ExpireAt: time.Unix(1_800_000_000, 0)}
			if i%2 == 0 {
				s.Will = &Will{Msg: Message{Topic: id + "/status", Payload: []byte("offline"), QoS: 1, Props: []byte{2, 1, 1}}, Delay: time.Second}
			}
			b.PutSession(&s)
			b.PutSub(id, Sub{Filter: id + "/cmd/#", Opts: 1, ID: 7})
			for q := range 3 {
				b.Enqueue(id, &Queued{Seq: uint64(q + 1), PID: uint16(q), Rec: q == 2, Msg: Message{Topic: id + "/q", Payload: bytes.Repeat([]byte{'p'}, 200), QoS: 1}})
			}
			b.AddAwaitingRel(id, uint16(i+1))
			for k := range 4 {
				b.SetRetained(&Message{Topic: fmt.Sprintf("plant/%s/s%d", id, k), Payload: bytes.Repeat([]byte{'r'}, 100), Retain: true})
			}
			b.OutboxPut("cloud", &OutboxEntry{Seq: uint64(i + 1), Route: 1, Added: int64(i), Msg: Message{Topic: "up/" + id, Payload: []byte("x"), QoS: 1}})
			b.DeadLetterPut("cloud", &DeadLetter{Seq: uint64(i + 1), Reason: "refused", At: int64(i), Failures: 3,
				Entry: OutboxEntry{Seq: uint64(i + 10), Route: 1, Msg: Message{Topic: "up/" + id + " bad", Payload: []byte("y"), QoS: 1}}})
		})
	}
	path := db.Path()
	if err := db.Close(); err != nil {
		f.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	return b
}

// FuzzStateFile opens arbitrary bytes as the state file, as the gateway
// does at start after a power cut or a failing SD card, and uses it every
// way the gateway can: load the sessions, match and get retained
// messages, scan the outboxes and dead letters, check and measure it,
// and commit to it.
// Nothing may panic, fault, loop or exhaust memory (which no recover
// catches, and would end the fuzzer's worker); a file that opens must
// report a damaged record as an error wrapping ErrCorrupt.
//
//	go test -run '^$' -fuzz FuzzStateFile -fuzztime 15s ./storage
func FuzzStateFile(f *testing.F) {
	good := fuzzStateFile(f)
	f.Add(good)
	ps := 4096
	for _, damage := range []func(b []byte){
		func(b []byte) { b[len(b)/2] ^= 0xff },           // a flipped byte inside the data pages
		func(b []byte) { clear(b[2*ps+16 : 2*ps+32]) },   // page 2's first element
		func(b []byte) { native.PutUint64(b[3*ps:], 1) }, // page 3 claims to be page 1
		func(b []byte) { native.PutUint32(b[3*ps+12:], 0x7fff_ffff) },
	} {
		if len(good) < 4*ps {
			break
		}
		b := bytes.Clone(good)
		damage(b)
		f.Add(b)
	}
	f.Add(good[:len(good)/2])
	f.Add([]byte{})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "state.db")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(path)
		probe(t, path, "")
	})
}
