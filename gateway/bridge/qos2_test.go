package bridge

import (
	"fmt"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit/faultproxy"
	"github.com/fieldgate/fieldgate/internal/testkit/mosquitto"
	"github.com/fieldgate/fieldgate/internal/testkit/pahotest"
	"github.com/fieldgate/fieldgate/internal/testkit/wiretest"
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
	up := mosquitto.Start(t, mosquitto.Config{})
	w := pahotest.WatchV5(t, up.Addr(), "watcher", "up/#", 2)
	p := faultproxy.New(t, up.Addr())
	routes := "    protocol: \"5\"\n    out:\n      - {filter: \"d/#\", topic: \"up/{2}\", qos: 2}\n"
	s := newSite(t, bridgeYAML(p.Addr(), routes), "")
	waitFor(t, "the link", func() bool { return s.br.Stats().State == StateConnected })
	if err := s.publish("d/first", "first"); err != nil {
		t.Fatal(err)
	}
	if m := w.Next(t); string(m.Payload) != "first" {
		t.Fatalf("got %q first", m.Payload)
	}
	waitFor(t, "the first message's completion", func() bool { return s.br.Stats().Depth == 0 })

	// The PUBLISH passes, its PUBREC comes back, the PUBREL is held.
	limit := p.UpSent() + int64(wiretest.PublishSize("up/held", len("held"), 2, 5))
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
	want := map[string]int{"held": 1, "unsent": 1, "reused-after": 1}
	got := map[string]int{}
	for name := range want {
		for got[name] == 0 {
			got[string(w.Next(t).Payload)]++
		}
	}
	// A second more lets a duplicate, or a message that should not come,
	// show.
	time.Sleep(time.Second)
	for len(w.Msgs) > 0 {
		got[string((<-w.Msgs).Payload)]++
	}
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
	up := mosquitto.Start(t, mosquitto.Config{})
	w := pahotest.WatchV5(t, up.Addr(), "watcher", "up/#", 2)
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
		got[string(w.Next(t).Payload)]++
	}
	time.Sleep(300 * time.Millisecond)
	for len(w.Msgs) > 0 {
		got[string((<-w.Msgs).Payload)]++
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
