package storage

import (
	"bytes"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

var testMessages = []struct {
	name string
	msg  Message
}{
	{"empty", Message{Topic: "a"}},
	{"qos0", Message{Topic: "plant/greenhouse-1/temp", Payload: []byte(`{"value":21.5}`)}},
	{"qos1 retain", Message{Topic: "t", Payload: []byte("x"), QoS: 1, Retain: true}},
	{"qos2 props expiry", Message{Topic: "$SYS/broker/uptime", Payload: []byte{0, 1, 2, 0xff}, Props: []byte{0x01, 0x01, 0x23, 0x00, 0x02}, QoS: 2, Expiry: 1_893_456_000_000_000_000}},
	{"negative expiry", Message{Topic: "t", QoS: 1, Expiry: math.MinInt64}},
	{"max expiry", Message{Topic: "t", Expiry: math.MaxInt64}},
	{"unicode empty levels", Message{Topic: "/ä//ß/", Payload: []byte("ü")}},
	{"long", Message{Topic: strings.Repeat("level/", 400), Payload: bytes.Repeat([]byte{0xaa}, 70_000), Props: bytes.Repeat([]byte{1}, 300)}},
}

func TestMessageRoundTrip(t *testing.T) {
	for _, tc := range testMessages {
		t.Run(tc.name, func(t *testing.T) {
			enc := appendMessage([]byte("prefix"), &tc.msg)
			got, ok := decodeMessage(enc[len("prefix"):])
			if !ok {
				t.Fatal("does not decode")
			}
			if d := sameMessage(&got, &tc.msg); d != "" {
				t.Fatal(d)
			}
			// The decoded message must not alias the record: bbolt's
			// memory map goes away with the transaction.
			rec := enc[len("prefix"):]
			for i := range rec {
				rec[i] ^= 0xff
			}
			if d := sameMessage(&got, &tc.msg); d != "" {
				t.Fatalf("decoded message shares the record's memory: %s", d)
			}
		})
	}
}

func TestQueuedRoundTrip(t *testing.T) {
	for _, tc := range []Queued{
		{Seq: 1, Msg: Message{Topic: "a/b", Payload: []byte("p"), QoS: 1}},
		{Seq: math.MaxUint64, PID: 65535, Rec: true, Msg: Message{Topic: "a", QoS: 2, Props: []byte{3}}},
		{Seq: 7, PID: 1, Msg: testMessages[3].msg},
	} {
		got, ok := decodeQueued(tc.Seq, appendQueued(nil, &tc))
		if !ok {
			t.Fatalf("%+v does not decode", tc)
		}
		if got.Seq != tc.Seq || got.PID != tc.PID || got.Rec != tc.Rec {
			t.Fatalf("got seq/pid/rec %d/%d/%t, want %d/%d/%t", got.Seq, got.PID, got.Rec, tc.Seq, tc.PID, tc.Rec)
		}
		if d := sameMessage(&got.Msg, &tc.Msg); d != "" {
			t.Fatal(d)
		}
	}
}

// TestOutboxRoundTrip also holds the record to the size OutboxPut
// reserves for it: a record longer than its reservation would cost the
// publish path an allocation, a shorter one leave a gap.
func TestOutboxRoundTrip(t *testing.T) {
	for i, tc := range testMessages {
		t.Run(tc.name, func(t *testing.T) {
			e := OutboxEntry{Seq: uint64(i) << 33, Route: uint16(i * 4099), Added: 1_750_000_000_000_000_000 - int64(i), Msg: tc.msg}
			enc := appendOutbox([]byte("prefix"), &e)
			rec := enc[len("prefix"):]
			if len(rec) != outboxRecordSize(&e) {
				t.Errorf("record of %d bytes, reserved %d", len(rec), outboxRecordSize(&e))
			}
			got, ok := decodeOutbox(e.Seq, rec)
			if !ok {
				t.Fatal("does not decode")
			}
			if got.Seq != e.Seq || got.Route != e.Route || got.Added != e.Added {
				t.Fatalf("seq/route/added %d/%d/%d, want %d/%d/%d", got.Seq, got.Route, got.Added, e.Seq, e.Route, e.Added)
			}
			if d := sameMessage(&got.Msg, &e.Msg); d != "" {
				t.Fatal(d)
			}
			route, added, p, ok := splitOutbox(rec)
			if !ok || route != e.Route || added != e.Added || outboxPartsSize(&p) != e.Size() {
				t.Errorf("split: route %d added %d size %d ok %t, want %d %d %d", route, added, outboxPartsSize(&p), ok, e.Route, e.Added, e.Size())
			}
			for i := range rec {
				rec[i] ^= 0xff
			}
			if d := sameMessage(&got.Msg, &e.Msg); d != "" {
				t.Fatalf("decoded entry shares the record's memory: %s", d)
			}
		})
	}
}

func TestOutboxEntrySize(t *testing.T) {
	for _, tc := range []struct {
		msg  Message
		want int
	}{
		{Message{}, 64},
		{Message{Topic: "site/a/temp", Payload: []byte("21.5")}, 64 + 11 + 4},
		{Message{Topic: "t", Payload: make([]byte, 1000), Props: []byte{1, 2, 3}, Expiry: 5, QoS: 2}, 64 + 1 + 1000 + 3},
	} {
		e := OutboxEntry{Seq: 1, Route: 3, Added: 9, Msg: tc.msg}
		if got := e.Size(); got != tc.want {
			t.Errorf("%+v: size %d, want %d", tc.msg, got, tc.want)
		}
	}
}

var testSessions = []struct {
	name string
	s    Session
}{
	{"connected", Session{ClientID: "dev1", Expiry: time.Hour}},
	{"no expiry no user", Session{ClientID: "x"}},
	{"disconnected", Session{ClientID: "dev2", User: "alice", Expiry: 7 * 24 * time.Hour, ExpireAt: time.Unix(1_800_000_000, 123_456_789)}},
	{"will", Session{ClientID: "dev3", User: "bob", Expiry: time.Minute, Will: &Will{
		Msg:   Message{Topic: "fieldgate/dev3/availability", Payload: []byte("offline"), QoS: 1, Retain: true, Props: []byte{0x02, 0, 0, 0, 60}},
		Delay: 30 * time.Second,
	}}},
	{"will pending", Session{ClientID: "dev4", ExpireAt: time.Unix(1_800_000_100, 0), Will: &Will{
		Msg:   Message{Topic: "w"},
		Delay: 5 * time.Second,
		At:    time.Unix(1_800_000_005, 42),
	}}},
	{"will before 1970", Session{ClientID: "old", ExpireAt: time.Unix(-10, 5), Will: &Will{Msg: Message{Topic: "w"}, At: time.Unix(-1, 0)}}},
}

func sameSession(t *testing.T, got, want *Session) {
	t.Helper()
	if got.ClientID != want.ClientID || got.User != want.User || got.Expiry != want.Expiry || !got.ExpireAt.Equal(want.ExpireAt) {
		t.Fatalf("session %+v, want %+v", got, want)
	}
	if (got.Will == nil) != (want.Will == nil) {
		t.Fatalf("will %+v, want %+v", got.Will, want.Will)
	}
	if want.Will == nil {
		return
	}
	if got.Will.Delay != want.Will.Delay || !got.Will.At.Equal(want.Will.At) {
		t.Fatalf("will %+v, want %+v", got.Will, want.Will)
	}
	if d := sameMessage(&got.Will.Msg, &want.Will.Msg); d != "" {
		t.Fatalf("will message: %s", d)
	}
}

func TestSessionRoundTrip(t *testing.T) {
	for _, tc := range testSessions {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := decodeSession(tc.s.ClientID, appendSession(nil, &tc.s))
			if !ok {
				t.Fatal("does not decode")
			}
			sameSession(t, &got, &tc.s)
		})
	}
}

// TestDecodeTruncated cuts every record at every length. No cut panics,
// and every cut before the payload (the one open-ended field) is refused;
// a cut inside the payload is a shorter payload, which no format without
// a length or checksum for it could tell.
func TestDecodeTruncated(t *testing.T) {
	type rec struct {
		name    string
		enc     []byte
		payload int // bytes of payload at the end
		decode  func([]byte) bool
	}
	var recs []rec
	msgDecode := func(b []byte) bool { _, ok := decodeMessage(b); return ok }
	queuedDecode := func(b []byte) bool { _, ok := decodeQueued(1, b); return ok }
	outboxDecode := func(b []byte) bool {
		_, ok := decodeOutbox(1, b)
		if _, _, _, split := splitOutbox(b); split != ok {
			panic("decodeOutbox and splitOutbox disagree")
		}
		return ok
	}
	for _, tc := range testMessages[:7] {
		recs = append(recs,
			rec{"message " + tc.name, appendMessage(nil, &tc.msg), len(tc.msg.Payload), msgDecode},
			rec{"queued " + tc.name, appendQueued(nil, &Queued{PID: 9, Msg: tc.msg}), len(tc.msg.Payload), queuedDecode},
			rec{"outbox " + tc.name, appendOutbox(nil, &OutboxEntry{Route: 2, Added: 7, Msg: tc.msg}), len(tc.msg.Payload), outboxDecode})
	}
	for _, tc := range testSessions {
		n := 0
		if tc.s.Will != nil {
			n = len(tc.s.Will.Msg.Payload)
		}
		recs = append(recs, rec{"session " + tc.name, appendSession(nil, &tc.s), n,
			func(b []byte) bool { _, ok := decodeSession("c", b); return ok }})
	}
	for _, r := range recs {
		if !r.decode(r.enc) {
			t.Fatalf("%s: the whole record does not decode", r.name)
		}
		for cut := 0; cut < len(r.enc); cut++ {
			ok := r.decode(bytes.Clone(r.enc[:cut]))
			if ok && cut < len(r.enc)-r.payload {
				t.Errorf("%s: cut to %d of %d bytes decodes", r.name, cut, len(r.enc))
			}
		}
	}
}

func TestDecodeGarbage(t *testing.T) {
	valid := appendMessage(nil, &Message{Topic: "a/b", Payload: []byte("p"), QoS: 1})
	bad := func(b []byte, i int, v byte) []byte { b = bytes.Clone(b); b[i] = v; return b }
	tests := []struct {
		name string
		b    []byte
	}{
		{"nil", nil},
		{"flags bit 3", bad(valid, 0, 8)},
		{"qos 3", bad(valid, 0, 3)},
		{"topic length past end", bad(valid, 9, 100)},
		{"uvarint overflow", append(bytes.Repeat([]byte{0}, 9), bytes.Repeat([]byte{0xff}, 11)...)},
		{"props length past end", append(bytes.Clone(valid[:13]), 0x7f)},
		{"huge length", append(bytes.Repeat([]byte{0}, 9), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01)},
	}
	for _, tc := range tests {
		if _, ok := decodeMessage(tc.b); ok {
			t.Errorf("message %s: decodes", tc.name)
		}
		if _, ok := decodeQueued(1, append([]byte{0, 1, 0}, tc.b...)); ok {
			t.Errorf("queued %s: decodes", tc.name)
		}
		outbox := append(make([]byte, outboxHeader), tc.b...)
		if _, ok := decodeOutbox(1, outbox); ok {
			t.Errorf("outbox %s: decodes", tc.name)
		}
		if _, _, _, ok := splitOutbox(outbox); ok {
			t.Errorf("outbox %s: splits", tc.name)
		}
	}
	for n := range outboxHeader {
		if _, ok := decodeOutbox(1, bytes.Clone(valid[:n])); ok {
			t.Errorf("outbox record of %d bytes decodes", n)
		}
	}
	if _, ok := decodeQueued(1, append([]byte{0, 1, 2}, valid...)); ok {
		t.Error("queued flags 2: decodes")
	}

	sess := appendSession(nil, &testSessions[3].s)
	noWill := appendSession(nil, &testSessions[0].s)
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"version 0", bad(noWill, 0, 0)},
		{"version 2", bad(noWill, 0, 2)},
		{"will flag 2", bad(noWill, len(noWill)-1, 2)},
		{"trailing byte", append(bytes.Clone(noWill), 0)},
		{"will message flags", bad(sess, len(sess)-len(testSessions[3].s.Will.Msg.Payload)-len(testSessions[3].s.Will.Msg.Props)-1-len(testSessions[3].s.Will.Msg.Topic)-1-9, 0xf0)},
		{"varint overflow", append([]byte{1}, bytes.Repeat([]byte{0xff}, 12)...)},
	} {
		if _, ok := decodeSession("c", tc.b); ok {
			t.Errorf("session %s: decodes", tc.name)
		}
	}

	// Random bytes: whatever they decode to, they must not panic.
	r := rand.New(rand.NewPCG(1, 2))
	for range 20_000 {
		b := make([]byte, r.IntN(64))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		decodeMessage(b)
		decodeQueued(0, b)
		decodeOutbox(0, b)
		decodeSession("c", b)
		decodeDeadLetter(0, b)
	}
}

// FuzzDecode feeds every record decoder the same bytes. None may panic,
// and whatever one accepts must encode to a record that decodes to the
// same value.
func FuzzDecode(f *testing.F) {
	for _, tc := range testMessages[:7] {
		f.Add(appendMessage(nil, &tc.msg))
		f.Add(appendQueued(nil, &Queued{PID: 3, Rec: true, Msg: tc.msg}))
		f.Add(appendOutbox(nil, &OutboxEntry{Route: 1, Added: -5, Msg: tc.msg}))
		f.Add(appendDeadLetter(nil, &DeadLetter{Reason: "refused: " + tc.msg.Topic, At: 7, Failures: 300, Entry: OutboxEntry{Seq: 9, Route: 2, Msg: tc.msg}}))
	}
	for _, tc := range testSessions {
		f.Add(appendSession(nil, &tc.s))
	}
	f.Add([]byte{})
	f.Add([]byte{1, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		in := bytes.Clone(b)
		if m, ok := decodeMessage(b); ok {
			m2, ok := decodeMessage(appendMessage(nil, &m))
			if !ok {
				t.Fatalf("message %+v: its encoding does not decode", m)
			}
			if d := sameMessage(&m2, &m); d != "" {
				t.Fatalf("message round trip: %s", d)
			}
		}
		if q, ok := decodeQueued(5, b); ok {
			q2, ok := decodeQueued(5, appendQueued(nil, &q))
			if !ok || q2.PID != q.PID || q2.Rec != q.Rec || q2.Seq != q.Seq || sameMessage(&q2.Msg, &q.Msg) != "" {
				t.Fatalf("queued round trip: %+v became %+v", q, q2)
			}
		}
		if e, ok := decodeOutbox(5, b); ok {
			e2, ok := decodeOutbox(5, appendOutbox(nil, &e))
			if !ok || e2.Route != e.Route || e2.Added != e.Added || sameMessage(&e2.Msg, &e.Msg) != "" {
				t.Fatalf("outbox round trip: %+v became %+v", e, e2)
			}
		}
		if d, ok := decodeDeadLetter(5, b); ok {
			rec := appendDeadLetter(nil, &d)
			d2, ok := decodeDeadLetter(5, rec)
			if !ok || len(rec) != deadLetterRecordSize(&d) || d2.Reason != d.Reason || d2.At != d.At || d2.Failures != d.Failures ||
				d2.Entry.Seq != d.Entry.Seq || d2.Entry.Route != d.Entry.Route || sameMessage(&d2.Entry.Msg, &d.Entry.Msg) != "" {
				t.Fatalf("dead letter round trip: %+v became %+v", d, d2)
			}
		}
		if s, ok := decodeSession("c", b); ok {
			s2, ok := decodeSession("c", appendSession(nil, &s))
			if !ok {
				t.Fatalf("session %+v: its encoding does not decode", s)
			}
			// Durations are whole seconds on disk; the decoded ones are too,
			// unless they overflowed, which a second encoding keeps as is.
			if s2.User != s.User || !s2.ExpireAt.Equal(s.ExpireAt) || (s2.Will == nil) != (s.Will == nil) {
				t.Fatalf("session round trip: %+v became %+v", s, s2)
			}
			if s.Will != nil && (!s2.Will.At.Equal(s.Will.At) || sameMessage(&s2.Will.Msg, &s.Will.Msg) != "") {
				t.Fatalf("session will round trip: %+v became %+v", s.Will, s2.Will)
			}
		}
		if !bytes.Equal(b, in) {
			t.Fatal("a decoder changed its input")
		}
	})
}
