package bridge

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/storage"
)

// TestQoS2ResumesAcrossRestart stops a bridge at the points a crash can
// leave a QoS 2 message in, and checks that the next start delivers each
// message upstream exactly once:
//   - its PUBREL sent and held on the way (the server holds the
//     identifier, awaiting PUBREL): the next start sends the PUBREL;
//   - PUBCOMP received but the outbox delete not on disk: PUBREL again,
//     which the server completes without a delivery;
//   - recorded, but the PUBLISH never reached the server: sent again
//     under its identifier, which the server takes as new;
//   - an older record holding an identifier a newer one took since: the
//     older message completed before the identifier was reused.
func TestQoS2ResumesAcrossRestart(t *testing.T) {
	up := startMosquitto(t, MosquittoConfig{})
	w := watchV5(t, up.Addr(), "watcher", "up/#", 2)
	p := newProxy(t, up.Addr())
	routes := "    protocol: \"5\"\n    out:\n      - {filter: \"d/#\", topic: \"up/{2}\", qos: 2}\n"
	s := newSite(t, bridgeYAML(p.Addr(), routes), "")
	waitFor(t, "the link", func() bool { return s.br.Stats().State == StateConnected })
	if err := s.publish("d/first", "first"); err != nil {
		t.Fatal(err)
	}
	if m := w.next(t); string(m.Payload) != "first" {
		t.Fatalf("got %q first", m.Payload)
	}
	waitFor(t, "the first message's completion", func() bool { return s.br.Stats().Depth == 0 })

	// The PUBLISH passes, its PUBREC comes back, the PUBREL is held.
	limit := p.UpSent() + int64(publishSize(&Outgoing{Topic: "up/held", QoS: 2, Payload: []byte("held")}, 5))
	p.HoldUpAfter(limit)
	if err := s.publish("d/held", "held"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the PUBREL held in the proxy", func() bool { return p.UpSent() == limit && p.Held() >= 4 })
	set, err := s.db.OutboxFlights("cloud")
	if err != nil || len(set.Flights) != 1 || !set.Flights[0].Released || !set.Tracked {
		t.Fatalf("records while the PUBREL is held: %+v, %v; want one, released", set, err)
	}
	held := set.Flights[0]
	go p.Close() // the link ends without a DISCONNECT: a crash, as the server sees it
	s.close()

	// What a crash at other moments leaves, written into the state file.
	db, err := storage.Open(s.path, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := db.OutboxInfo("cloud")
	if err != nil || info.Count != 1 {
		t.Fatalf("outbox after the stop: %+v, %v; want the held message", info, err)
	}
	seq, stamp := info.LastSeq, held.Stamp
	var b storage.Batch
	inject := func(name string, pid uint16, released bool) {
		seq++
		stamp++
		b.OutboxPut("cloud", &storage.OutboxEntry{Seq: seq, Added: time.Now().UnixNano(),
			Msg: storage.Message{Topic: "up/" + name, Payload: []byte(name), QoS: 2}})
		b.OutboxFlightPut("cloud", &storage.OutboxFlight{Seq: seq, PID: pid, Released: released, Stamp: stamp})
	}
	inject("completed", 700, true)
	inject("unsent", 701, false)
	inject("reused-before", 702, false)
	inject("reused-after", 702, false)
	if err := db.CommitWait(&b); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	s2 := newSite(t, bridgeYAML(up.Addr(), routes), s.path)
	waitFor(t, "the outbox to empty", func() bool { return s2.br.Stats().Depth == 0 })
	got := map[string]int{}
	deadline := time.After(time.Second)
collect:
	for {
		select {
		case m := <-w.msgs:
			got[string(m.Payload)]++
		case <-deadline:
			break collect
		}
	}
	want := map[string]int{"held": 1, "unsent": 1, "reused-after": 1}
	for name, n := range want {
		if got[name] != n {
			t.Errorf("%s arrived %d times, want %d", name, got[name], n)
		}
	}
	for name, n := range got {
		if want[name] == 0 {
			t.Errorf("%s arrived %d times, want none: it was delivered before the restart", name, n)
		}
	}
	for why, n := range s2.br.Stats().Dropped {
		if n > 0 {
			t.Errorf("%d dropped as %s: a PUBREL the server completed before is no refusal", n, why)
		}
	}
	if st := s2.br.Stats(); st.Resumed != 4 {
		t.Errorf("%d messages resumed under their identifiers, want 4 (held, completed, unsent, reused-after)", st.Resumed)
	}
	waitFor(t, "the records to go with their entries", func() bool {
		set, err := s2.db.OutboxFlights("cloud")
		return err == nil && len(set.Flights) == 0
	})
}

// TestQoS2NewSession: records of a session the server no longer has are
// dropped, and their messages sent as new, once each.
func TestQoS2NewSession(t *testing.T) {
	up := startMosquitto(t, MosquittoConfig{})
	w := watchV5(t, up.Addr(), "watcher", "up/#", 2)
	routes := "    protocol: \"5\"\n    session_expiry: 0s\n    out:\n      - {filter: \"d/#\", topic: \"up/{2}\", qos: 2}\n"
	s := newSite(t, bridgeYAML(up.Addr(), routes), "")
	waitFor(t, "the link", func() bool { return s.br.Stats().State == StateConnected })
	s.close()
	db, err := storage.Open(s.path, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var b storage.Batch
	for i := range 3 {
		seq := uint64(100 + i)
		b.OutboxPut("cloud", &storage.OutboxEntry{Seq: seq, Added: time.Now().UnixNano(),
			Msg: storage.Message{Topic: fmt.Sprintf("up/m%d", i), Payload: fmt.Appendf(nil, "m%d", i), QoS: 2}})
		b.OutboxFlightPut("cloud", &storage.OutboxFlight{Seq: seq, PID: uint16(900 + i), Released: i == 2, Stamp: uint64(i + 1)})
	}
	if err := db.CommitWait(&b); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s2 := newSite(t, bridgeYAML(up.Addr(), routes), s.path)
	waitFor(t, "the outbox to empty", func() bool { return s2.br.Stats().Depth == 0 })
	got := map[string]int{}
	for len(got) < 3 {
		got[string(w.next(t).Payload)]++
	}
	time.Sleep(300 * time.Millisecond)
	for len(w.msgs) > 0 {
		got[string((<-w.msgs).Payload)]++
	}
	for i := range 3 {
		if n := got[fmt.Sprintf("m%d", i)]; n != 1 {
			t.Errorf("m%d arrived %d times, want once", i, n)
		}
	}
	if st := s2.br.Stats(); st.Resumed != 0 {
		t.Errorf("%d resumed without a session", st.Resumed)
	}
}

// TestClientHeldRelease: with OnPubrec the PUBREL waits for ReleaseHeld;
// reserved identifiers take places in the window.
func TestClientHeldRelease(t *testing.T) {
	up := startMosquitto(t, MosquittoConfig{})
	w := watchV5(t, up.Addr(), "watcher", "h/#", 2)
	recs := make(chan uint16, 4)
	c := dial(t, ClientOptions{Address: up.Addr(), ClientID: "held", MaxInflight: 3, OnPubrec: func(pid uint16) { recs <- pid }})

	r1, err := c.ReserveID()
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c.ReserveID()
	if err != nil || r2 == r1 {
		t.Fatalf("second reservation %d, %v (first %d)", r2, err, r1)
	}
	done := make(chan result, 2)
	pid, err := c.Publish(&Outgoing{Topic: "h/a", QoS: 2, Payload: []byte("a"), PacketID: r1}, func(err error, reason byte) { done <- result{err, reason} })
	if err != nil || pid != r1 {
		t.Fatalf("publish under a reserved id: %d, %v; want %d", pid, err, r1)
	}
	if _, err := c.ReserveID(); err != nil {
		t.Fatalf("third place: %v", err)
	}
	if _, err := c.Publish(&Outgoing{Topic: "h/x", QoS: 1}, nil); !errors.Is(err, ErrWindowFull) {
		t.Errorf("publish with the window reserved: %v, want ErrWindowFull", err)
	}
	if _, err := c.ReserveID(); !errors.Is(err, ErrWindowFull) {
		t.Errorf("reservation beyond the window: %v, want ErrWindowFull", err)
	}
	c.CancelID(r2)
	if _, err := c.Publish(&Outgoing{Topic: "h/b", QoS: 1, Payload: []byte("b")}, nil); err != nil {
		t.Errorf("publish after CancelID: %v", err)
	}

	var got uint16
	select {
	case got = <-recs:
	case <-time.After(upWait):
		t.Fatal("no PUBREC")
	}
	if got != r1 {
		t.Fatalf("OnPubrec(%d), want %d", got, r1)
	}
	// Mosquitto delivers a QoS 2 message when it is released: nothing
	// arrives, and nothing completes, while the PUBREL is held.
	time.Sleep(300 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("done(%v, 0x%02X) with the PUBREL held", r.err, r.reason)
	default:
	}
	for len(w.msgs) > 0 {
		if m := <-w.msgs; string(m.Payload) == "a" {
			t.Fatal("delivered with the PUBREL held")
		}
	}
	if err := c.ReleaseHeld(r1 + 100); err == nil {
		t.Error("ReleaseHeld of an identifier with nothing held succeeded")
	}
	if err := c.ReleaseHeld(r1); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.err != nil || r.reason != 0 {
		t.Errorf("done(%v, 0x%02X), want PUBCOMP", r.err, r.reason)
	}
	for {
		m := w.next(t)
		if string(m.Payload) == "a" {
			break
		}
	}

	// Held when the link ends: the message is past PUBREC.
	pid, err = c.Publish(&Outgoing{Topic: "h/c", QoS: 2, Payload: []byte("c")}, func(err error, reason byte) { done <- result{err, reason} })
	if err != nil {
		t.Fatal(err)
	}
	if got := <-recs; got != pid {
		t.Fatalf("OnPubrec(%d), want %d", got, pid)
	}
	c.Close()
	if r := <-done; !errors.Is(r.err, ErrReleasePending) {
		t.Errorf("done of a held message at close: %v, want ErrReleasePending", r.err)
	}
}
