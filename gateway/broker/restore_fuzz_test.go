package broker

import (
	"bufio"
	"context"
	"encoding/binary"
	"path/filepath"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/storage"
)

// fuzzRecords turns fuzz bytes into what a state file may hold: sessions
// with wills, subscriptions, queued and in-flight messages and awaiting
// PUBREL identifiers, and retained messages, with the values the broker
// writes and the ones a damaged file or an older build could hold.
type fuzzRecords struct{ b []byte }

func (r *fuzzRecords) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *fuzzRecords) pick(from []string) string { return from[int(r.byte())%len(from)] }

// raw returns up to 15 bytes of the input as they are.
func (r *fuzzRecords) raw() []byte {
	n := min(int(r.byte()%16), len(r.b))
	b := r.b[:n:n]
	r.b = r.b[n:]
	return b
}

func (r *fuzzRecords) duration() time.Duration {
	return []time.Duration{0, time.Second, time.Hour, -time.Second, 1 << 62}[r.byte()%5]
}

func (r *fuzzRecords) instant() time.Time {
	return []time.Time{{}, time.Unix(1000, 0), time.Now().Add(time.Hour), time.Now().Add(-time.Second)}[r.byte()%4]
}

func (r *fuzzRecords) message(topics []string) storage.Message {
	m := storage.Message{Topic: r.pick(topics), Payload: r.raw(), QoS: r.byte() % 3, Retain: r.byte()&1 == 1}
	if r.byte()&1 == 1 {
		m.Props = r.raw()
	}
	switch r.byte() % 3 {
	case 1:
		m.Expiry = time.Now().Add(time.Hour).UnixNano()
	case 2:
		m.Expiry = 1
	}
	return m
}

var (
	fuzzClientIDs = []string{"c1", "c2", "$c", "\xff", "a/b", "c1"}
	fuzzTopics    = []string{"a/b", "c1/x", "w/t", "", "a/#", "+", "$SYS/x", "a\x00b", "\xc0"}
	fuzzFilters   = []string{"a/#", "+", "#", "c1/+/x", "$share/g/a/#", "$share//a", "a/#/b", "", "$SYS/#", "a+"}
)

// FuzzRestore starts the broker on a state file holding arbitrary
// records, as after a crash or a downgrade, then has a client resume each
// stored session and acknowledge what it is sent, and a new client use
// the broker. Restoring may refuse the file with an error, but nothing may
// panic, and a broker that started must serve a well-behaved client.
//
//	go test -run '^$' -fuzz FuzzRestore -fuzztime 15s ./gateway/broker
func FuzzRestore(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 0, 0, 2, 0, 1, 0, 0, 4, 'h', 'i', '!', '?', 1, 0, 0, 1, 2, 0, 1, 3, 0, 1, 2, 3, 4})
	f.Add([]byte{2, 1, 2, 2, 1, 1, 2, 5, 1, 0, 1, 3, 2, 0, 3, 9, 9, 3, 2, 1, 0, 1, 2, 0, 7, 1, 1, 1, 2, 2, 5})
	f.Add([]byte{1, 0, 1, 2, 2, 1, 1, 4, 0x11, 0, 0, 0, 3, 1, 1, 3, 0xC7, 0, 0, 0, 3, 7, 5, 1, 2, 1, 1, 0, 2, 3, 0x26, 0, 1})
	// An expired session subscribed to # with options granting QoS 3:
	// the index took the subscription, and ending the session panicked.
	f.Add([]byte("\x01\x02\x00\x01\x03\x00\x01\x02\x03h"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &fuzzRecords{b: data}
		db, err := storage.Open(filepath.Join(t.TempDir(), "state.db"), storage.Options{LazyDelay: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var bt storage.Batch
		var ids []string
		for range r.byte() % 3 {
			s := storage.Session{ClientID: r.pick(fuzzClientIDs), User: r.pick([]string{"", "u"}), Expiry: r.duration(), ExpireAt: r.instant()}
			if r.byte()&1 == 1 {
				s.Will = &storage.Will{Msg: r.message(fuzzTopics), Delay: r.duration(), At: r.instant()}
			}
			bt.PutSession(&s)
			ids = append(ids, s.ClientID)
			for range r.byte() % 3 {
				bt.PutSub(s.ClientID, storage.Sub{Filter: r.pick(fuzzFilters), Opts: r.byte(), ID: uint32(r.byte())<<20 | uint32(r.byte())})
			}
			for range r.byte() % 4 {
				q := &storage.Queued{Seq: uint64(r.byte()), Rec: r.byte()&1 == 1, Msg: r.message(fuzzTopics)}
				if r.byte()&1 == 1 {
					q.PID = uint16(r.byte())
				}
				bt.Enqueue(s.ClientID, q)
			}
			for range r.byte() % 2 {
				bt.AddAwaitingRel(s.ClientID, uint16(r.byte()))
			}
		}
		for range r.byte() % 3 {
			m := r.message(fuzzTopics)
			bt.SetRetained(&m)
		}
		if err := db.CommitWait(&bt); err != nil {
			return // a record bbolt cannot hold never reaches the file
		}

		opts := Options{Config: DefaultConfig(), Version: "fuzz", Store: db, QueuePolicy: storage.QueueDropOldest}
		opts.AllowAnonymous = true
		opts.SysInterval = 0
		b, err := New(opts, nil)
		if err != nil {
			return
		}
		if err := b.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), fuzzWait)
			defer cancel()
			if err := b.Shutdown(ctx); err != nil {
				t.Errorf("shutdown: %v", err)
			}
		}()
		for _, id := range ids {
			fuzzResume(t, b, id)
		}
		fuzzNormalClient(t, b)
	})
}

// fuzzResume connects as id without a clean start, so that the stored
// session is taken up, acknowledges every message it is sent until the
// broker goes quiet, and disconnects.
func fuzzResume(t *testing.T, b *Broker, id string) {
	client, served := fuzzConn(b)
	defer func() {
		client.Close()
		select {
		case <-served:
		case <-time.After(fuzzWait):
			t.Fatalf("the connection of %q was still served %v after its client closed", id, fuzzWait)
		}
	}()
	w := &wireConn{t: t, nc: client, r: bufio.NewReader(client)}
	// MQTT 5, no clean start, session expiry 1 h.
	w.sendLoose(wireFrame(wireCONNECT, wireStr("MQTT"), []byte{5, 0, 0, 0}, []byte{5, 0x11, 0, 0, 0x0E, 0x10}, wireStr(id)))
	for range 64 {
		// Wait briefly for the next packet: the broker sends what the
		// session holds at once.
		_ = client.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if _, err := w.r.Peek(1); err != nil {
			break
		}
		h, body, err := w.read()
		if err != nil {
			return
		}
		if len(body) < 2 {
			continue
		}
		switch h >> 4 {
		case 3: // PUBLISH: acknowledge by its QoS
			if qos := h >> 1 & 3; qos > 0 {
				n := int(binary.BigEndian.Uint16(body))
				if 2+n+2 > len(body) {
					continue
				}
				pid := body[2+n : 2+n+2]
				ack := byte(wirePUBACK)
				if qos == 2 {
					ack = wirePUBREC
				}
				w.sendLoose([]byte{ack, 2, pid[0], pid[1]})
			}
		case 6: // PUBREL of a restored QoS 2 message past its PUBREC
			w.sendLoose([]byte{wirePUBCOMP, 2, body[0], body[1]})
		}
	}
	w.sendLoose([]byte{wireDISCONNECT, 0})
}
