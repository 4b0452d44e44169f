package bridge

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit/mosquitto"
	"github.com/fieldgate/fieldgate/storage"
)

// loneBridge is a bridge on a state file of its own, without a local
// broker: tests queue its messages straight into the outbox, and read
// what it logs.
type loneBridge struct {
	*Bridge
	db  *storage.DB
	log *logRecorder
}

func newLoneBridge(t *testing.T, body string) *loneBridge {
	t.Helper()
	return newLoneBridgeAlive(t, body, nil)
}

// newLoneBridgeAlive is newLoneBridge with a watchdog's alive.
func newLoneBridgeAlive(t *testing.T, body string, alive func()) *loneBridge {
	t.Helper()
	db, err := storage.Open(filepath.Join(t.TempDir(), "state.db"), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec := newLogRecorder()
	br, err := New(parseBridge(t, "bridges:\n  - name: cloud\n"+body), Options{Device: "gw1", Store: db, Log: slog.New(rec), Alive: alive})
	if err != nil {
		t.Fatal(err)
	}
	br.Start(context.Background(), nil)
	t.Cleanup(func() {
		br.Stop()
		_ = db.Close()
		if t.Failed() {
			// What the bridge said, debug lines too: a failure on a busy
			// machine is read from this.
			for _, r := range rec.find(slog.LevelDebug, "") {
				t.Logf("bridge log: %s %s %v", r.level, r.msg, r.attrs)
			}
		}
	})
	return &loneBridge{Bridge: br, db: db, log: rec}
}

// queue puts messages on out-route 0's remote topics, durably, as a
// local publish that the route matched would.
func (lb *loneBridge) queue(t *testing.T, topics ...string) {
	t.Helper()
	var batch storage.Batch
	r := &lb.rt.Load().outs[0]
	for _, topic := range topics {
		lb.ob.put(r, topic, []byte("x"), false, &batch, time.Now())
	}
	if err := lb.db.CommitWait(&batch); err != nil {
		t.Fatal(err)
	}
}

// TestUnproductiveLinksBackOff: a server that closes every link right
// after CONNACK is redialled with a growing backoff, not at once, and the
// log says why once, not once per link; when the server keeps a link
// again and it delivers, the log says the link recovered and after how
// many attempts.
func TestUnproductiveLinksBackOff(t *testing.T) {
	f := startFakeUp(t, fakeMode{closeAfterConnack: true})
	lb := newLoneBridge(t, fmt.Sprintf("    address: %q\n    protocol: \"3.1.1\"\n    reconnect_min: 100ms\n    reconnect_max: 2s\n    ack_timeout: 5s\n    out:\n      - {filter: \"data/#\", topic: \"up/{2}\"}\n", f.addr()))
	const n = 6
	waitFor(t, "six links", func() bool { return len(f.dialTimes()) >= n })
	dials := f.dialTimes()
	for i := 1; i < n; i++ {
		// backoffFloor is the least a retry waits; the old loop redialled
		// within a millisecond or two.
		if gap := dials[i].Sub(dials[i-1]); gap < backoffFloor-10*time.Millisecond {
			t.Errorf("link %d came %v after the one before, want at least the backoff's %v", i+1, gap, backoffFloor)
		}
	}
	if st := lb.Stats(); st.Failing < n-1 {
		t.Errorf("Stats.Failing %d after %d unproductive links", st.Failing, n)
	}
	if got := lb.log.find(slog.LevelWarn, "ended before it delivered anything"); len(got) != 1 {
		t.Errorf("%d warnings of links that delivered nothing over %d such links, want 1", len(got), n)
	}
	if got := lb.log.find(slog.LevelInfo, "upstream connected"); len(got) != 1 {
		t.Errorf("%d connections logged over %d links, want the first alone", len(got), n)
	}

	f.set(fakeMode{})
	lb.queue(t, "up/after")
	waitFor(t, "the message once the server keeps the link", func() bool { return slices.Contains(f.topics(), "up/after") })
	waitFor(t, "the recovery logged", func() bool { return len(lb.log.find(slog.LevelInfo, "upstream link recovered")) == 1 })
	rec := lb.log.find(slog.LevelInfo, "upstream link recovered")[0]
	if rec.attrs["attempts"] == "" || rec.attrs["attempts"] == "1" {
		t.Errorf("recovery logged with attempts %q, want how many it took", rec.attrs["attempts"])
	}
	if st := lb.Stats(); st.Failing != 0 {
		t.Errorf("Stats.Failing %d once the link delivered, want 0", st.Failing)
	}
}

// TestPoisonedMessageIsMovedAside: a 3.1.1 Mosquitto with max_packet_size
// closes the link on a message larger than that, as NATS does on a topic
// it refuses; after dead_letter_after links the message is moved aside,
// and the forty behind it (and the five before) arrive, in order.
func TestPoisonedMessageIsMovedAside(t *testing.T) {
	up := mosquitto.Start(t, mosquitto.Config{Global: []string{"max_packet_size 2000"}})
	w := watch(t, up.Addr(), "watcher", "up/#", false)
	s := newSite(t, bridgeYAML(up.Addr(), "    protocol: \"3.1.1\"\n    out:\n      - {filter: \"data/#\", topic: \"up/{2}\"}\n"), "")
	waitFor(t, "the link", func() bool { return s.br.Stats().State == StateConnected })
	var want []string
	for i := range 5 {
		want = append(want, fmt.Sprintf("before-%d", i))
	}
	for i := range 40 {
		want = append(want, fmt.Sprintf("after-%02d", i))
	}
	for _, p := range want[:5] {
		if err := s.publish("data/ok", p); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.publish("data/big", strings.Repeat("x", 3000)); err != nil {
		t.Fatal(err)
	}
	for _, p := range want[5:] {
		if err := s.publish("data/ok", p); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the messages around the refused one upstream", func() bool { return len(uniq(w.topics()["up/ok"])) == len(want) })
	if got := firstSeen(w.topics()["up/ok"]); !slices.Equal(got, want) {
		t.Errorf("upstream got %v, want %v in order", got, want)
	}
	if n := w.count("up/big"); n != 0 {
		t.Errorf("the refused message arrived %d times", n)
	}
	waitFor(t, "an empty outbox", func() bool { return s.br.Stats().Depth == 0 })
	st := s.br.Stats()
	deadLettered(t, s.br, "up/big", strings.Repeat("x", 3000))
	// The window's link, the probes up to dead_letter_after, the link
	// that delivers the rest; a few more for links a loaded machine's
	// Mosquitto may end on its own.
	if st.Reconnects > 3+3 {
		t.Errorf("%d links for one refused message, want about dead_letter_after", st.Reconnects)
	}
}

// TestProbeBlamesOnlyTheRefused: when the acknowledgement of the message
// before a refused one is lost with the link, the first suspect is that
// healthy message; its probe goes through, and only the refused message
// is moved aside, whatever its place in the window.
func TestProbeBlamesOnlyTheRefused(t *testing.T) {
	f := startFakeUp(t, fakeMode{closeOnSpace: true, lagAcks: true})
	lb := newLoneBridge(t, fmt.Sprintf("    address: %q\n    protocol: \"3.1.1\"\n    keepalive: 1s\n    reconnect_min: 100ms\n    reconnect_max: 500ms\n    ack_timeout: 5s\n    dead_letter_after: 2\n    out:\n      - {filter: \"data/#\", topic: \"up/{2}\"}\n", f.addr()))
	waitFor(t, "the link", func() bool { return lb.Stats().State == StateConnected })
	var want []string
	for i := range 10 {
		want = append(want, fmt.Sprintf("up/%02d", i))
	}
	lb.queue(t, want[:4]...)
	lb.queue(t, "up/bad topic")
	lb.queue(t, want[4:]...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("upstream got %v; bridge %+v", f.topics(), lb.Stats())
		}
	})
	waitFor(t, "the healthy messages upstream", func() bool {
		got := uniq(f.topics())
		for _, w := range want {
			if !got[w] {
				return false
			}
		}
		return true
	})
	if got := firstSeen(f.topics()); !slices.Equal(got, want) {
		t.Errorf("upstream got %v, want %v in order", got, want)
	}
	waitFor(t, "an empty outbox", func() bool { return lb.Stats().Depth == 0 })
	deadLettered(t, lb.Bridge, "up/bad topic", "x")
	moved := lb.log.find(slog.LevelWarn, "dead letters")
	if len(moved) != 1 || moved[0].attrs["topic"] != "up/bad topic" {
		t.Errorf("moved aside: %+v, want up/bad topic alone", moved)
	}
}

// TestQoS2RefusedOn311: a 3.1.1 Mosquitto with max_qos 1 closes the link
// on a QoS 2 PUBLISH, as NATS with reject_qos2_publish does. The bridge
// learns it with one warning, sends its QoS 2 route at QoS 1 to it, keeps
// no QoS 2 record behind, and moves nothing aside.
func TestQoS2RefusedOn311(t *testing.T) {
	up := mosquitto.Start(t, mosquitto.Config{Listener: []string{"max_qos 1"}})
	w := watch(t, up.Addr(), "watcher", "up/#", false)
	lb := newLoneBridge(t, bridgeYAML(up.Addr(), "    protocol: \"3.1.1\"\n    out:\n      - {filter: \"data/#\", topic: \"up/{2}\", qos: 2}\n"))
	waitFor(t, "the link", func() bool { return lb.Stats().State == StateConnected })
	var want []string
	for i := range 10 {
		want = append(want, fmt.Sprintf("up/%d", i))
	}
	lb.queue(t, want...)
	waitFor(t, "every message upstream", func() bool {
		for _, topic := range want {
			if w.count(topic) == 0 {
				return false
			}
		}
		return true
	})
	waitFor(t, "an empty outbox", func() bool { return lb.Stats().Depth == 0 })
	st := lb.Stats()
	if st.QoSLimit != 1 {
		t.Errorf("Stats.QoSLimit %d, want 1 once QoS 2 was refused", st.QoSLimit)
	}
	if got := lb.log.find(slog.LevelWarn, "QoS 2 routes go at QoS 1"); len(got) != 1 {
		t.Errorf("%d warnings of the refused QoS 2, want 1", len(got))
	} else if !strings.Contains(got[0].attrs["routes"], "out[0] data/#") {
		t.Errorf("the warning names routes %q, want out[0] data/#", got[0].attrs["routes"])
	}
	if st.DeadLettered != 0 {
		t.Errorf("%d dead letters, want none: the messages go at QoS 1", st.DeadLettered)
	}
	set, err := lb.db.OutboxFlights("cloud")
	if err != nil || len(set.Flights) != 0 {
		t.Errorf("QoS 2 records %+v, %v; want none left", set.Flights, err)
	}

	// A reload that changes the link forgets it: QoS 2 is tried again.
	cfg := lb.rt.Load().cfg
	cfg.KeepAlive = 2 * time.Minute
	if err := lb.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	if st := lb.Stats(); st.QoSLimit != 2 {
		t.Errorf("Stats.QoSLimit %d after a reload that changed the link, want 2", st.QoSLimit)
	}
}

// TestMaximumQoSWarnsOnce: an MQTT 5 server whose CONNACK says Maximum
// QoS 1 gets the QoS 2 route's messages at QoS 1, with one warning naming
// the route however often the link is made again.
func TestMaximumQoSWarnsOnce(t *testing.T) {
	up := mosquitto.Start(t, mosquitto.Config{Listener: []string{"max_qos 1"}})
	w := watch(t, up.Addr(), "watcher", "up/#", false)
	lb := newLoneBridge(t, bridgeYAML(up.Addr(), "    out:\n      - {filter: \"fast/#\", topic: \"up/fast\", qos: 1}\n      - {filter: \"data/#\", topic: \"up/{2}\", qos: 2}\n"))
	for i := range 3 {
		waitFor(t, "the link", func() bool { return lb.Stats().State == StateConnected && lb.Stats().Reconnects == uint64(i+1) })
		lb.shared.mu.Lock()
		c := lb.shared.client
		lb.shared.mu.Unlock()
		if i < 2 {
			_ = c.Close() // a link our side ends: the next one comes at once
		}
	}
	if got := lb.log.find(slog.LevelWarn, "Maximum QoS"); len(got) != 1 {
		t.Errorf("%d warnings of the Maximum QoS over 3 links, want 1", len(got))
	} else if r := got[0].attrs["routes"]; !strings.Contains(r, "out[1] data/#") || strings.Contains(r, "out[0]") {
		t.Errorf("the warning names routes %q, want out[1] alone", r)
	}
	if st := lb.Stats(); st.QoSLimit != 1 {
		t.Errorf("Stats.QoSLimit %d, want the server's 1", st.QoSLimit)
	}
	var batch storage.Batch
	lb.ob.put(&lb.rt.Load().outs[1], "up/q2", []byte("x"), false, &batch, time.Now())
	if err := lb.db.CommitWait(&batch); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the QoS 2 route's message", func() bool { return w.count("up/q2") == 1 })
}

// TestProtocolFallbackIsRemembered: a server that refuses MQTT 5 with
// 3.1.1's return code 1 (NATS) is dialled with 3.1.1 straight away after
// the first fallback, until a reload changes the link.
func TestProtocolFallbackIsRemembered(t *testing.T) {
	f := startFakeUp(t, fakeMode{refuseV5: true})
	lb := newLoneBridge(t, fmt.Sprintf("    address: %q\n    reconnect_min: 100ms\n    reconnect_max: 500ms\n    ack_timeout: 5s\n    out:\n      - {filter: \"data/#\", topic: \"up/{2}\"}\n", f.addr()))
	waitFor(t, "the first link", func() bool { return lb.Stats().Reconnects == 1 })
	for i := 2; i <= 3; i++ {
		f.closeAll()
		waitFor(t, "the link again", func() bool { return lb.Stats().Reconnects == uint64(i) })
	}
	if got := f.connectVersions(); !slices.Equal(got, []byte{5, 4, 4, 4}) {
		t.Errorf("CONNECT versions %v, want [5 4 4 4]: MQTT 5 once, then 3.1.1 straight away", got)
	}
	if st := lb.Stats(); st.Protocol != 4 {
		t.Errorf("Stats.Protocol %d, want 4", st.Protocol)
	}
	if got := lb.log.find(slog.LevelInfo, "refused MQTT 5"); len(got) != 1 {
		t.Errorf("%d lines about the refused MQTT 5, want 1", len(got))
	}
	cfg := lb.rt.Load().cfg
	cfg.KeepAlive = 2 * time.Minute
	if err := lb.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the link after the reload", func() bool { return lb.Stats().Reconnects == 4 })
	if got := f.connectVersions(); !slices.Equal(got, []byte{5, 4, 4, 4, 5, 4}) {
		t.Errorf("CONNECT versions %v after a reload, want MQTT 5 tried again: [5 4 4 4 5 4]", got)
	}
}

// deadLettered checks that br moved one message aside, on topic with
// payload, after its dead_letter_after failures, with the server's reason.
func deadLettered(t *testing.T, br *Bridge, topic, payload string) {
	t.Helper()
	if st := br.Stats(); st.DeadLettered != 1 || st.DeadLetters != 1 {
		t.Errorf("%d moved to the dead letters, %d kept, want the refused message alone", st.DeadLettered, st.DeadLetters)
	}
	ds, err := br.DeadLetters(0)
	if err != nil || len(ds) != 1 {
		t.Fatalf("dead letters %+v, %v; want one", ds, err)
	}
	d := ds[0]
	if d.Entry.Msg.Topic != topic || string(d.Entry.Msg.Payload) != payload {
		t.Errorf("dead letter on %q with %d bytes, want %q with %d", d.Entry.Msg.Topic, len(d.Entry.Msg.Payload), topic, len(payload))
	}
	if n := br.rt.Load().cfg.DeadLetterAfter; d.Failures != n || !strings.Contains(d.Reason, "closed") {
		t.Errorf("dead letter after %d failures for %q, want %d and the server's close", d.Failures, d.Reason, n)
	}
}

// TestRefusedInTheAcknowledgement: an MQTT 5 server that refuses a message
// in its PUBACK (here Mosquitto's ACL, 0x87) keeps the link: the message
// is moved to the dead letters, with the reason, where a person can retry
// or drop it, and the messages around it go on in order on the same link.
func TestRefusedInTheAcknowledgement(t *testing.T) {
	acl := filepath.Join(t.TempDir(), "acl")
	if err := os.WriteFile(acl, []byte("topic readwrite up/ok\ntopic read up/#\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	up := mosquitto.Start(t, mosquitto.Config{Global: []string{"acl_file " + acl}})
	w := watch(t, up.Addr(), "watcher", "up/#", false)
	s := newSite(t, bridgeYAML(up.Addr(), "    protocol: \"5\"\n    out:\n      - {filter: \"data/#\", topic: \"up/{2}\"}\n"), "")
	waitFor(t, "the link", func() bool { return s.br.Stats().State == StateConnected })
	var want []string
	for i := range 6 {
		want = append(want, fmt.Sprintf("ok-%d", i))
	}
	for i, p := range want {
		if i == 3 {
			if err := s.publish("data/denied", "refused"); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.publish("data/ok", p); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the messages around the refused one upstream", func() bool { return len(uniq(w.topics()["up/ok"])) == len(want) })
	if got := firstSeen(w.topics()["up/ok"]); !slices.Equal(got, want) {
		t.Errorf("upstream got %v, want %v in order", got, want)
	}
	waitFor(t, "the refused message moved aside", func() bool { st := s.br.Stats(); return st.Depth == 0 && st.DeadLettered == 1 })
	ds, err := s.br.DeadLetters(0)
	if err != nil || len(ds) != 1 {
		t.Fatalf("dead letters %+v, %v; want the refused message alone", ds, err)
	}
	if d := ds[0]; d.Entry.Msg.Topic != "up/denied" || string(d.Entry.Msg.Payload) != "refused" || !strings.Contains(d.Reason, "0x87") {
		t.Errorf("dead letter on %q with %q for %q; want up/denied, its payload, and the server's code 0x87", d.Entry.Msg.Topic, d.Entry.Msg.Payload, d.Reason)
	}
	st := s.br.Stats()
	if st.Reconnects != 1 {
		t.Errorf("%d links; a refusal in an acknowledgement keeps the link", st.Reconnects)
	}
	if n := st.Dropped[DropRejected]; n != 0 {
		t.Errorf("%d counted as dropped; a refused message is kept as a dead letter", n)
	}
}
