package bridge

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/fieldgate/fieldgate/gateway/bridge/mqttclient"
	"github.com/fieldgate/fieldgate/gateway/broker"
	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/internal/testkit/faultproxy"
	"github.com/fieldgate/fieldgate/internal/testkit/mosquitto"
	"github.com/fieldgate/fieldgate/internal/testkit/wiretest"
	"github.com/fieldgate/fieldgate/storage"
)

// site is a gateway's core for bridge tests: a state file, the broker with
// the bridge as its outbound queue, the bridge running on the broker's
// in-process client, and a local in-process publisher.
type site struct {
	t      *testing.T
	path   string
	db     *storage.DB
	b      *broker.Broker
	br     *Bridge
	local  *broker.Client
	pub    *broker.Client
	closed bool
}

// outbound adapts a Bridge to the broker, as the gateway does.
type outbound struct{ *Bridge }

func (o outbound) Offer(m *broker.Offered, batch *storage.Batch) error {
	switch err := o.Bridge.Offer(m.Topic, m.Payload, m.Retain, m.From, batch); {
	case err == nil:
		return nil
	case errors.Is(err, ErrTopicRules):
		return broker.ErrTopicRefused
	default:
		return broker.ErrQueueFull
	}
}

// newSite starts a site whose one bridge is configured by bridgeYAML (the
// body of one list item, indented four spaces); statePath may name an
// existing state file to reopen.
func newSite(t *testing.T, bridgeYAML, statePath string) *site {
	t.Helper()
	if statePath == "" {
		statePath = filepath.Join(t.TempDir(), "state.db")
	}
	bc := parseBridge(t, "bridges:\n  - name: cloud\n"+bridgeYAML)
	bcfg := broker.DefaultConfig()
	bcfg.AllowAnonymous, bcfg.SysInterval = true, 0
	db, err := storage.Open(statePath, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	br, err := New(bc, Options{Device: "gw1", Store: db, Log: log, Availability: "fieldgate/gw1/availability"})
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	b, err := broker.New(broker.Options{Config: bcfg, Store: db, Outbound: []broker.Outbound{outbound{br}}}, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	local, err := b.Connect(br.LocalID())
	if err != nil {
		t.Fatal(err)
	}
	pub, err := b.Connect("test-publisher")
	if err != nil {
		t.Fatal(err)
	}
	br.Start(context.Background(), local)
	s := &site{t: t, path: statePath, db: db, b: b, br: br, local: local, pub: pub}
	t.Cleanup(s.close)
	return s
}

func (s *site) close() {
	if s.closed {
		return
	}
	s.closed = true
	s.br.Stop()
	s.local.Close()
	s.pub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Scale(5*time.Second))
	defer cancel()
	_ = s.b.Shutdown(ctx)
	if err := s.db.Close(); err != nil {
		s.t.Errorf("closing the state file: %v", err)
	}
}

// publish publishes locally at QoS 1 and waits for the broker's
// acknowledgement: from then on the message must reach the upstream.
func (s *site) publish(topic, payload string) error {
	return s.pub.Publish(context.Background(), topic, []byte(payload), 1, false)
}

// watcher is a real MQTT client on the upstream recording what it gets.
type watcher struct {
	mu   sync.Mutex
	msgs []mqtt.Message
	c    mqtt.Client
}

// watch connects a 3.1.1 client to the upstream and subscribes to filter
// at QoS 1; with persistent, its session (and what is queued for it)
// survives the upstream's restarts.
func watch(t *testing.T, addr, id, filter string, persistent bool) *watcher {
	t.Helper()
	w := &watcher{}
	opts := mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).
		SetCleanSession(!persistent).SetAutoReconnect(true).SetMaxReconnectInterval(200 * time.Millisecond).
		SetConnectRetry(true).SetConnectRetryInterval(200 * time.Millisecond).SetOrderMatters(true)
	opts.SetDefaultPublishHandler(func(_ mqtt.Client, m mqtt.Message) {
		w.mu.Lock()
		w.msgs = append(w.msgs, m)
		w.mu.Unlock()
	})
	w.c = mqtt.NewClient(opts)
	if tok := w.c.Connect(); !tok.WaitTimeout(upWait) || tok.Error() != nil {
		t.Fatalf("watcher connect: %v", tok.Error())
	}
	if tok := w.c.Subscribe(filter, 1, nil); !tok.WaitTimeout(upWait) || tok.Error() != nil {
		t.Fatalf("watcher subscribe: %v", tok.Error())
	}
	t.Cleanup(func() { w.c.Disconnect(100) })
	return w
}

func (w *watcher) topics() map[string][]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string][]string{}
	for _, m := range w.msgs {
		out[m.Topic()] = append(out[m.Topic()], string(m.Payload()))
	}
	return out
}

func (w *watcher) count(topic string) int { return len(w.topics()[topic]) }

func bridgeYAML(addr string, extra string) string {
	return fmt.Sprintf("    address: %q\n    reconnect_min: 100ms\n    reconnect_max: 500ms\n    ack_timeout: 5s\n%s", addr, extra)
}

// TestRoutesOutAndIn: local messages go up remapped, commands come down
// remapped to local subscribers, and what came down is not sent back up
// by an out-route that also matches it.
func TestRoutesOutAndIn(t *testing.T) {
	up := mosquitto.Start(t, mosquitto.Config{})
	w := watch(t, up.Addr(), "watcher", "#", false)
	s := newSite(t, bridgeYAML(up.Addr(), `    out:
      - {filter: "fieldgate/{device}/#", topic: "sites/{device}/{3}/{4}"}
    in:
      - {filter: "commands/{device}/#", topic: "fieldgate/{device}/{3}/set"}
`), "")
	waitFor(t, "the link", func() bool { return s.br.Stats().State == StateConnected })

	got := make(chan string, 10)
	if err := s.pub.Subscribe("fieldgate/gw1/+/set", 1, func(m broker.Message) { got <- m.Topic + "=" + string(m.Payload) }); err != nil {
		t.Fatal(err)
	}
	if err := s.publish("fieldgate/gw1/climate/temperature", `{"value":21.5}`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the reading upstream", func() bool { return w.count("sites/gw1/climate/temperature") == 1 })
	if p := w.topics()["sites/gw1/climate/temperature"][0]; p != `{"value":21.5}` {
		t.Errorf("upstream payload %q", p)
	}

	cmd := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + up.Addr()).SetClientID("cloud-app"))
	if tok := cmd.Connect(); !tok.WaitTimeout(upWait) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	defer cmd.Disconnect(100)
	cmd.Publish("commands/gw1/pump", 1, false, "ON").WaitTimeout(upWait)
	select {
	case m := <-got:
		if m != "fieldgate/gw1/pump/set=ON" {
			t.Errorf("local subscriber got %q, want fieldgate/gw1/pump/set=ON", m)
		}
	case <-time.After(upWait):
		t.Fatal("the command did not reach the local subscriber")
	}
	// The command matched the out-route too; it must not loop back up.
	if err := s.publish("fieldgate/gw1/climate/humidity", "40"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a later reading upstream", func() bool { return w.count("sites/gw1/climate/humidity") == 1 })
	if n := w.count("sites/gw1/pump/set"); n != 0 {
		t.Errorf("the command came back upstream %d times; an inbound message must not go out again", n)
	}
	st := s.br.Stats()
	if st.Inbound != 1 || st.Acked < 2 || st.Depth != 0 {
		t.Errorf("stats %+v, want 1 inbound, 2 acknowledged, an empty outbox", st)
	}
}

// TestOutageKeepsEverythingInOrder: with the upstream down, K messages on
// two routes are acknowledged locally; once it is back, all K arrive, in
// order per route.
func TestOutageKeepsEverythingInOrder(t *testing.T) {
	const k = 400
	up := mosquitto.Start(t, mosquitto.Config{Persistence: true, AutosaveEvery: 1})
	w := watch(t, up.Addr(), "watcher", "up/#", true)
	s := newSite(t, bridgeYAML(up.Addr(), `    rate: 0
    out:
      - {filter: "data/a/#", topic: "up/a"}
      - {filter: "data/b/#", topic: "up/b"}
`), "")
	waitFor(t, "the link", func() bool { return s.br.Stats().State == StateConnected })
	up.Stop()
	waitFor(t, "the link to drop", func() bool { return s.br.Stats().State != StateConnected })
	for i := range k {
		route := "a"
		if i%3 == 0 {
			route = "b"
		}
		if err := s.publish("data/"+route+"/x", strconv.Itoa(i)); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	if d := s.br.Stats().Depth; d != k {
		t.Errorf("outbox depth %d during the outage, want %d", d, k)
	}
	up.Start()
	waitFor(t, "every message upstream", func() bool {
		tp := w.topics()
		return len(uniq(tp["up/a"]))+len(uniq(tp["up/b"])) >= k
	})
	for _, topic := range []string{"up/a", "up/b"} {
		last := -1
		for _, p := range firstSeen(w.topics()[topic]) {
			n, _ := strconv.Atoi(p)
			if n <= last {
				t.Errorf("%s: %d after %d: out of order", topic, n, last)
			}
			last = n
		}
	}
	waitFor(t, "the outbox to empty", func() bool { return s.br.Stats().Depth == 0 })
}

// uniq returns the distinct values of s.
func uniq(s []string) map[string]bool {
	m := map[string]bool{}
	for _, v := range s {
		m[v] = true
	}
	return m
}

// firstSeen returns s without repeats, each value where it first appeared.
func firstSeen(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// TestSilentOutageIsDetected: a link that goes quiet without closing is
// replaced within the keepalive and acknowledgement bounds, and what was
// published meanwhile arrives once traffic flows again.
func TestSilentOutageIsDetected(t *testing.T) {
	up := mosquitto.Start(t, mosquitto.Config{})
	w := watch(t, up.Addr(), "watcher", "up/#", false)
	proxy := faultproxy.New(t, up.Addr())
	s := newSite(t, fmt.Sprintf("    address: %q\n    keepalive: 1s\n    ack_timeout: 2s\n    reconnect_min: 100ms\n    reconnect_max: 500ms\n    out:\n      - {filter: \"data/#\", topic: \"up/{2}\"}\n", proxy.Addr()), "")
	waitFor(t, "the link", func() bool { return s.br.Stats().State == StateConnected })
	before := s.br.Stats().Reconnects
	proxy.Freeze()
	frozen := time.Now()
	if err := s.publish("data/during", "1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the silent link to be noticed", func() bool { return s.br.Stats().State != StateConnected })
	// Keepalive 1s plus the 2s acknowledgement bound, with room for a
	// loaded machine; a link that looked up for a minute would fail.
	if d := time.Since(frozen); d > 10*time.Second {
		t.Errorf("the silent outage took %s to notice, want about 3s", d)
	}
	proxy.Thaw()
	waitFor(t, "a new link", func() bool { return s.br.Stats().Reconnects > before })
	waitFor(t, "the message sent during the outage", func() bool { return w.count("up/during") >= 1 })
}

// TestReceiveMaximumBoundsTheWindow: an upstream that takes 10 messages
// in flight gets at most 10, and all of a burst arrive.
func TestReceiveMaximumBoundsTheWindow(t *testing.T) {
	const n = 300
	up := mosquitto.Start(t, mosquitto.Config{MaxInflight: 10})
	w := watch(t, up.Addr(), "watcher", "up/#", false)
	s := newSite(t, bridgeYAML(up.Addr(), "    rate: 0\n    max_inflight: 64\n    out:\n      - {filter: \"data/#\", topic: \"up/{2}\"}\n"), "")
	waitFor(t, "the link", func() bool { return s.br.Stats().State == StateConnected })
	if win := s.br.Stats().Window; win != 10 {
		t.Errorf("window %d, want the upstream's Receive Maximum of 10", win)
	}
	var wg sync.WaitGroup
	for g := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n / 10 {
				if err := s.publish(fmt.Sprintf("data/%d", g), strconv.Itoa(i)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	waitFor(t, "every message upstream", func() bool {
		total := 0
		for _, v := range w.topics() {
			total += len(uniq(v))
		}
		return total >= n
	})
	if peak := s.br.Stats().PeakInflight; peak > 10 || peak == 0 {
		t.Errorf("peak in flight %d, want 1..10", peak)
	}
}

// TestOutboxFullByClass fills a small outbox with the upstream away:
// telemetry drops its oldest, alarms are refused while full and never
// dropped, state keeps only the latest per topic.
func TestOutboxFullByClass(t *testing.T) {
	nowhere := testkit.FreeAddr(t)
	payload := strings.Repeat("x", 200)

	t.Run("telemetry", func(t *testing.T) {
		s := newSite(t, bridgeYAML(nowhere, "    max_outbox_bytes: 65536\n    out:\n      - {filter: \"t/#\"}\n"), "")
		for i := range 1000 {
			if err := s.publish("t/x", fmt.Sprintf("%04d%s", i, payload)); err != nil {
				t.Fatalf("publish %d: %v", i, err)
			}
		}
		st := s.br.Stats()
		if st.Bytes > 65536 || st.Dropped[DropOldest] == 0 || st.Depth+int(st.Dropped[DropOldest]) != 1000 {
			t.Errorf("stats %+v: want at most 64 KiB kept and the rest dropped as oldest", st)
		}
		first, last := outboxEnds(t, s)
		if !strings.HasPrefix(last, "0999") || strings.HasPrefix(first, "0000") {
			t.Errorf("outbox runs from %.4s to %.4s, want the newest kept", first, last)
		}
	})
	t.Run("alarm", func(t *testing.T) {
		s := newSite(t, bridgeYAML(nowhere, "    max_outbox_bytes: 65536\n    out:\n      - {filter: \"a/#\", class: alarm}\n"), "")
		refused := 0
		for i := range 1000 {
			err := s.publish("a/x", fmt.Sprintf("%04d%s", i, payload))
			if errors.Is(err, broker.ErrQueueFull) {
				refused++
			} else if err != nil {
				t.Fatal(err)
			}
		}
		st := s.br.Stats()
		if refused == 0 || st.Dropped[DropRefused] != uint64(refused) || st.Dropped[DropOldest] != 0 {
			t.Errorf("%d refused, stats %+v: want refusals once full and nothing dropped", refused, st)
		}
		if first, _ := outboxEnds(t, s); !strings.HasPrefix(first, "0000") {
			t.Errorf("the oldest alarm %.4s was dropped", first)
		}
	})
	t.Run("state", func(t *testing.T) {
		s := newSite(t, bridgeYAML(nowhere, "    out:\n      - {filter: \"s/#\", class: state}\n"), "")
		for i := range 100 {
			for _, topic := range []string{"s/door", "s/valve"} {
				if err := s.publish(topic, strconv.Itoa(i)); err != nil {
					t.Fatal(err)
				}
			}
		}
		st := s.br.Stats()
		if st.Depth != 2 || st.Dropped[DropSuperseded] != 198 {
			t.Errorf("stats %+v: want the latest of each of 2 topics, 198 superseded", st)
		}
		if _, last := outboxEnds(t, s); last != "99" {
			t.Errorf("latest queued %q, want 99", last)
		}
	})
}

// outboxEnds returns the payloads of the first and last outbox entries,
// once the last publish's batch is on disk.
func outboxEnds(t *testing.T, s *site) (first, last string) {
	t.Helper()
	if err := s.db.CommitWait(&storage.Batch{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // lazy commits of drops land within a second
	err := s.db.OutboxScan("cloud", 0, 0, func(e *storage.OutboxEntry) bool {
		if first == "" {
			first = string(e.Msg.Payload)
		}
		last = string(e.Msg.Payload)
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return first, last
}

// TestOutboxSurvivesRestart: what was queued when the gateway stopped is
// sent when it starts again.
func TestOutboxSurvivesRestart(t *testing.T) {
	up := mosquitto.Start(t, mosquitto.Config{})
	nowhere := testkit.FreeAddr(t)
	s := newSite(t, bridgeYAML(nowhere, "    out:\n      - {filter: \"d/#\", topic: \"up/{2}\"}\n"), "")
	for i := range 50 {
		if err := s.publish("d/x", strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	s.close()
	w := watch(t, up.Addr(), "watcher", "up/#", false)
	s2 := newSite(t, bridgeYAML(up.Addr(), "    out:\n      - {filter: \"d/#\", topic: \"up/{2}\"}\n"), s.path)
	if d := s2.br.Stats().Depth; d != 50 {
		t.Errorf("outbox depth %d after the restart, want 50", d)
	}
	waitFor(t, "the queued messages upstream", func() bool { return len(uniq(w.topics()["up/x"])) == 50 })
	waitFor(t, "the outbox to empty", func() bool { return s2.br.Stats().Depth == 0 })
}

// TestOverlappingInRoutes: with subscription identifiers each overlapping
// in-route gets exactly its messages once; on 3.1.1, which has none, the
// configuration is refused naming both filters.
func TestOverlappingInRoutes(t *testing.T) {
	routes := `    in:
      - {filter: "cmd/#", topic: "all/{topic}"}
      - {filter: "cmd/+/relay", topic: "relays/{2}"}
`
	up := mosquitto.Start(t, mosquitto.Config{})
	s := newSite(t, bridgeYAML(up.Addr(), "    protocol: \"5\"\n"+routes), "")
	// The link is up before its in-routes are subscribed; a command sent
	// in between would find no subscription upstream.
	waitFor(t, "the in-routes subscribed", func() bool {
		s.br.in.mu.Lock()
		defer s.br.in.mu.Unlock()
		return s.br.in.open
	})
	var mu sync.Mutex
	got := map[string]int{}
	if err := s.pub.Subscribe("#", 1, func(m broker.Message) { mu.Lock(); got[m.Topic]++; mu.Unlock() }); err != nil {
		t.Fatal(err)
	}
	cmd := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + up.Addr()).SetClientID("cloud-app"))
	if tok := cmd.Connect(); !tok.WaitTimeout(upWait) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	defer cmd.Disconnect(100)
	cmd.Publish("cmd/7/relay", 1, false, "ON").WaitTimeout(upWait)
	cmd.Publish("cmd/7/lamp", 1, false, "ON").WaitTimeout(upWait)
	waitFor(t, "the commands locally", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return got["all/cmd/7/lamp"] == 1 && got["relays/7"] == 1
	})
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	want := map[string]int{"all/cmd/7/relay": 1, "relays/7": 1, "all/cmd/7/lamp": 1}
	for topic, n := range want {
		if got[topic] != n {
			t.Errorf("%s arrived %d times, want %d", topic, got[topic], n)
		}
	}
	if len(got) != len(want) {
		t.Errorf("local topics %v, want exactly %v", got, want)
	}
	mu.Unlock()

	bc := parseBridge(t, "bridges:\n  - name: cloud\n"+bridgeYAML(up.Addr(), "    protocol: \"3.1.1\"\n"+routes))
	_, err := New(bc, Options{Device: "gw1"})
	if err == nil || !strings.Contains(err.Error(), "cmd/#") || !strings.Contains(err.Error(), "cmd/+/relay") {
		t.Errorf("New with overlapping filters on 3.1.1 = %v, want an error naming both", err)
	}
}

// recordingLocal is a Local that records what the bridge publishes.
type recordingLocal struct {
	mu     sync.Mutex
	topics []string
}

func (r *recordingLocal) Publish(_ context.Context, topic string, _ []byte, _ byte, _ bool) error {
	r.mu.Lock()
	r.topics = append(r.topics, topic)
	r.mu.Unlock()
	return nil
}

// cmdRoute is the in-route of the recording bridges: cmd/# to local/{2}.
const cmdRoute = "    in:\n      - {filter: \"cmd/#\", topic: \"local/{2}\"}\n"

// newRecordingBridge returns a bridge, not started, configured by body
// (a bridge's keys after its name), whose local publishes rec records.
func newRecordingBridge(t *testing.T, body string) (*Bridge, *recordingLocal) {
	t.Helper()
	b, err := New(parseBridge(t, "bridges:\n  - name: cloud\n"+body), Options{Device: "gw1"})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recordingLocal{}
	b.local = rec
	return b, rec
}

// TestUnclaimedMessagesWait: messages that arrive before the in-routes
// are open (a resumed session's backlog) wait, at most maxHeld of them,
// and are delivered once the routes open.
func TestUnclaimedMessagesWait(t *testing.T) {
	b, rec := newRecordingBridge(t, bridgeYAML("127.0.0.1:1", cmdRoute))
	for i := range maxHeld + 10 {
		b.onMessage(&mqttclient.Incoming{Topic: "cmd/" + strconv.Itoa(i), Payload: []byte("x"), QoS: 1})
	}
	if len(rec.topics) != 0 {
		t.Fatalf("%d delivered before the routes opened", len(rec.topics))
	}
	if len(b.in.held) != maxHeld || b.in.held[0].Topic != "cmd/10" {
		t.Errorf("%d held, first %s; want %d, the oldest 10 dropped", len(b.in.held), b.in.held[0].Topic, maxHeld)
	}
	b.openRoutes(context.Background())
	if len(rec.topics) != maxHeld || rec.topics[0] != "local/10" {
		t.Errorf("delivered %d, first %v; want %d from local/10", len(rec.topics), rec.topics[:1], maxHeld)
	}
	if st := b.Stats(); st.Dropped["unclaimed"] != 10 {
		t.Errorf("unclaimed drops %d, want 10", st.Dropped["unclaimed"])
	}
}

// TestSharedInRouteReceives: a message that came through a shared
// in-route, without subscription identifiers, is claimed by that route:
// the server matched it against the filter after $share/{group}/.
func TestSharedInRouteReceives(t *testing.T) {
	b, rec := newRecordingBridge(t, bridgeYAML("127.0.0.1:1", "    in:\n      - {filter: \"$share/gw/cmd/#\", topic: \"local/{2}\"}\n"))
	b.openRoutes(context.Background())
	b.onMessage(&mqttclient.Incoming{Topic: "cmd/pump", Payload: []byte("x"), QoS: 1})
	if !slices.Equal(rec.topics, []string{"local/pump"}) {
		t.Errorf("delivered %v, want [local/pump]", rec.topics)
	}
	if st := b.Stats(); st.Dropped["unclaimed"] != 0 {
		t.Errorf("unclaimed drops %d, want 0", st.Dropped["unclaimed"])
	}
}

// TestMessagesWhileRoutesOpen: a message that arrives on the reader
// while the in-routes are being opened is delivered, never left held,
// and never ahead of the messages held before it.
func TestMessagesWhileRoutesOpen(t *testing.T) {
	b, rec := newRecordingBridge(t, bridgeYAML("127.0.0.1:1", cmdRoute))
	ctx := context.Background()
	for round := range 3000 {
		rec.topics = rec.topics[:0]
		b.in.mu.Lock()
		b.in.open = false
		b.in.mu.Unlock()
		b.onMessage(&mqttclient.Incoming{Topic: "cmd/backlog", Payload: []byte("x"), QoS: 1})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.onMessage(&mqttclient.Incoming{Topic: "cmd/live", Payload: []byte("x"), QoS: 1})
		}()
		b.openRoutes(ctx)
		wg.Wait()
		rec.mu.Lock()
		got := slices.Clone(rec.topics)
		rec.mu.Unlock()
		if !slices.Equal(got, []string{"local/backlog", "local/live"}) {
			b.in.mu.Lock()
			held := len(b.in.held)
			b.in.mu.Unlock()
			t.Fatalf("round %d: delivered %v with %d still held; want the backlog, then the live message", round, got, held)
		}
	}
}

func TestPacer(t *testing.T) {
	p := newPacer(100, 10)
	if n := p.take(64); n != 10 {
		t.Errorf("first take = %d, want the burst of 10", n)
	}
	if n := p.take(64); n > 1 {
		t.Errorf("take right after = %d, want about 0", n)
	}
	p.last = p.last.Add(-100 * time.Millisecond) // 100 ms pass
	if n := p.take(64); n < 9 || n > 10 {
		t.Errorf("take after 100 ms at 100/s = %d, want about 10", n)
	}
	if n := newPacer(0, 1).take(64); n != 64 {
		t.Errorf("unpaced take = %d, want all 64", n)
	}
}

// TestExpiryKeepsAlarms: past max_outbox_age telemetry is dropped and
// counted; alarms are never dropped.
func TestExpiryKeepsAlarms(t *testing.T) {
	nowhere := testkit.FreeAddr(t)
	s := newSite(t, bridgeYAML(nowhere, "    max_outbox_age: 1m\n    out:\n      - {filter: \"t/#\"}\n      - {filter: \"a/#\", class: alarm}\n"), "")
	for i := range 5 {
		if err := s.publish("t/x", strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.publish("a/x", "fire"); err != nil {
		t.Fatal(err)
	}
	s.br.ob.expire(time.Now().Add(2 * time.Minute))
	st := s.br.Stats()
	if st.Depth != 1 || st.Dropped[DropExpired] != 5 {
		t.Errorf("stats %+v, want the alarm kept and 5 expired", st)
	}
	if first, _ := outboxEnds(t, s); first != "fire" {
		t.Errorf("outbox holds %q, want the alarm", first)
	}
}

// TestMemoryOnlyRoute: a QoS 0 memory-only route reaches the upstream
// without touching the outbox on disk.
func TestMemoryOnlyRoute(t *testing.T) {
	up := mosquitto.Start(t, mosquitto.Config{})
	w := watch(t, up.Addr(), "watcher", "up/#", false)
	s := newSite(t, bridgeYAML(up.Addr(), "    out:\n      - {filter: \"dbg/#\", topic: \"up/{2}\", qos: 0, memory_only: true}\n"), "")
	waitFor(t, "the link", func() bool { return s.br.Stats().State == StateConnected })
	for i := range 5 {
		if err := s.pub.Publish(context.Background(), "dbg/x", []byte(strconv.Itoa(i)), 0, false); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the messages upstream", func() bool { return w.count("up/x") == 5 })
	info, err := s.db.OutboxInfo("cloud")
	if err != nil || info.LastSeq != 0 {
		t.Errorf("outbox on disk %+v (%v), want never written", info, err)
	}
}

// TestMutualTLSFromConfig: the bridge's tls: keys (a CA file, a client
// certificate and key, a server name) reach an upstream that requires a
// client certificate.
func TestMutualTLSFromConfig(t *testing.T) {
	up := mosquitto.Start(t, mosquitto.Config{TLS: true, RequireCertificate: true})
	w := watch(t, up.Addr(), "watcher", "up/#", false)
	pki := up.PKI()
	tlsYAML := fmt.Sprintf("    tls: {enabled: true, ca_file: %q, cert: %q, key: %q, server_name: localhost}\n",
		pki.CAFile, pki.ClientCert, pki.ClientKey)
	s := newSite(t, bridgeYAML(up.TLSAddr(), tlsYAML+"    out:\n      - {filter: \"d/#\", topic: \"up/{2}\"}\n"), "")
	waitFor(t, "the TLS link", func() bool { return s.br.Stats().State == StateConnected })
	if err := s.publish("d/x", "over tls"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the message upstream", func() bool { return w.count("up/x") == 1 })

	// Without the client certificate the upstream refuses the link.
	s2 := newSite(t, bridgeYAML(up.TLSAddr(), fmt.Sprintf("    tls: {enabled: true, ca_file: %q}\n    out:\n      - {filter: \"d/#\"}\n", up.PKI().CAFile)), "")
	waitFor(t, "the refused link", func() bool { st := s2.br.Stats(); return st.State == StateDown && st.LastError != "" })
	if st := s2.br.Stats(); st.Reconnects != 0 {
		t.Errorf("a link without a client certificate came up: %+v", st)
	}
}

// TestQoS2ResumesAfterSilentOutage: QoS 2 messages in flight when the link
// goes quiet are resent under their identifiers on the next link (the
// session is present upstream), so each arrives exactly once.
func TestQoS2ResumesAfterSilentOutage(t *testing.T) {
	const n = 60
	up := mosquitto.Start(t, mosquitto.Config{})
	var mu sync.Mutex
	got := map[string]int{}
	opts := mqtt.NewClientOptions().AddBroker("tcp://" + up.Addr()).SetClientID("exactly-once")
	opts.SetDefaultPublishHandler(func(_ mqtt.Client, m mqtt.Message) { mu.Lock(); got[string(m.Payload())]++; mu.Unlock() })
	wc := mqtt.NewClient(opts)
	if tok := wc.Connect(); !tok.WaitTimeout(upWait) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	defer wc.Disconnect(100)
	if tok := wc.Subscribe("up/#", 2, nil); !tok.WaitTimeout(upWait) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	proxy := faultproxy.New(t, up.Addr())
	s := newSite(t, fmt.Sprintf("    address: %q\n    keepalive: 1s\n    ack_timeout: 2s\n    reconnect_min: 100ms\n    reconnect_max: 300ms\n    rate: 50\n    out:\n      - {filter: \"d/#\", topic: \"up/{2}\", qos: 2}\n", proxy.Addr()), "")
	waitFor(t, "the link", func() bool { return s.br.Stats().State == StateConnected })
	// The first connection after a start is clean: a later one resumes.
	before := s.br.Stats().Reconnects
	for i := range n {
		if err := s.publish("d/x", strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
		if i == n/3 {
			proxy.Freeze()
		}
	}
	waitFor(t, "the silent link to be replaced", func() bool { return s.br.Stats().State != StateConnected })
	proxy.Thaw()
	waitFor(t, "a new link", func() bool { return s.br.Stats().Reconnects > before })
	waitFor(t, "every message", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == n })
	waitFor(t, "the outbox to empty", func() bool { return s.br.Stats().Depth == 0 })
	if r := s.br.Stats().Resumed; r == 0 {
		t.Error("nothing was resent under its identifier: the outage caught no message in flight")
	}
	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for p, c := range got {
		if c != 1 {
			t.Errorf("%s arrived %d times at QoS 2", p, c)
		}
	}
}

// TestReconfigure: a reload changes the routes of a running bridge; a
// removed in-route is unsubscribed upstream.
func TestReconfigure(t *testing.T) {
	up := mosquitto.Start(t, mosquitto.Config{})
	w := watch(t, up.Addr(), "watcher", "#", false)
	s := newSite(t, bridgeYAML(up.Addr(), "    out:\n      - {filter: \"d/#\", topic: \"old/{2}\"}\n    in:\n      - {filter: \"cmd/#\", topic: \"local/{2}\"}\n"), "")
	waitFor(t, "the link", func() bool { return s.br.Stats().State == StateConnected })
	if err := s.publish("d/x", "1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the old route", func() bool { return w.count("old/x") == 1 })

	bc := parseBridge(t, "bridges:\n  - name: cloud\n"+bridgeYAML(up.Addr(), "    out:\n      - {filter: \"d/#\", topic: \"new/{2}\"}\n    in:\n      - {filter: \"ota/#\", topic: \"local/{2}\"}\n"))
	before := s.br.Stats().Reconnects
	if err := s.br.Reconfigure(bc); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the new link", func() bool { st := s.br.Stats(); return st.Reconnects > before && st.State == StateConnected })
	if err := s.publish("d/x", "2"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the new route", func() bool { return w.count("new/x") == 1 })
	if n := w.count("old/x"); n != 1 {
		t.Errorf("old route used %d times after the reload", n)
	}
	var mu sync.Mutex
	var local []string
	if err := s.pub.Subscribe("local/#", 1, func(m broker.Message) { mu.Lock(); local = append(local, m.Topic); mu.Unlock() }); err != nil {
		t.Fatal(err)
	}
	cmd := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + up.Addr()).SetClientID("cloud-app"))
	if tok := cmd.Connect(); !tok.WaitTimeout(upWait) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	defer cmd.Disconnect(100)
	cmd.Publish("cmd/old", 1, false, "x").WaitTimeout(upWait)
	cmd.Publish("ota/new", 1, false, "x").WaitTimeout(upWait)
	waitFor(t, "the new in-route", func() bool { mu.Lock(); defer mu.Unlock(); return len(local) >= 1 })
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(local) != 1 || local[0] != "local/new" {
		t.Errorf("local got %v, want only local/new: the removed in-route must be unsubscribed", local)
	}
}

// TestReconfigureDuringDial: a reload that lands while the link is being
// dialled, when there is no link yet to close, still replaces it: the
// bridge ends up connected with the new settings, not with the link it
// was dialling under the old ones.
func TestReconfigureDuringDial(t *testing.T) {
	oldUp := mosquitto.Start(t, mosquitto.Config{})
	newUp := mosquitto.Start(t, mosquitto.Config{})
	wOld := watch(t, oldUp.Addr(), "watcher", "up/#", false)
	wNew := watch(t, newUp.Addr(), "watcher", "up/#", false)
	proxy := faultproxy.New(t, oldUp.Addr())
	proxy.HoldUpAfter(0) // the CONNECT waits in the proxy: the dial is under way
	routes := "    out:\n      - {filter: \"d/#\", topic: \"up/{2}\"}\n"
	s := newSite(t, bridgeYAML(proxy.Addr(), routes), "")
	waitFor(t, "the CONNECT at the proxy", func() bool { return proxy.Held() > 0 })

	if err := s.br.Reconfigure(parseBridge(t, "bridges:\n  - name: cloud\n"+bridgeYAML(newUp.Addr(), routes))); err != nil {
		t.Fatal(err)
	}
	proxy.Thaw() // the dial under the old settings completes
	waitFor(t, "the link", func() bool { return s.br.Stats().State == StateConnected })
	if err := s.publish("d/x", "1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the message at the new upstream", func() bool { return wNew.count("up/x") == 1 })
	if n := wOld.count("up/x"); n != 0 {
		t.Errorf("the old upstream got %d messages after the reload", n)
	}
	if st := s.br.Stats(); st.Reconnects != 1 {
		t.Errorf("%d connections counted, want 1: the link dialled before the reload is not one", st.Reconnects)
	}
}

// TestStopDeliversHeldMessages: messages that came before the in-routes
// opened were acknowledged upstream as they were held, so a stop before
// the routes open delivers them locally rather than dropping them.
// Mosquitto answers every SUBSCRIBE at once; the upstream here is a 3.1.1
// test double that sends a session's backlog and never answers it.
func TestStopDeliversHeldMessages(t *testing.T) {
	const n = 5
	ln, wg := wiretest.Listen(t)
	acked := make(chan uint16, n)
	wg.Add(1)
	go func() {
		defer wg.Done()
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		_ = nc.SetDeadline(time.Now().Add(upWait))
		r := bufio.NewReader(nc)
		if fh, _, err := mqttwire.ReadPacket(r, 0, nil); err != nil || fh.Type != 1 {
			return
		}
		stream := []byte{0x20, 2, 1, 0} // CONNACK, session present
		for i := range n {
			pid := []byte{0, byte(i + 1)}
			stream = append(stream, wiretest.Frame(0x32, wiretest.Str("cmd/"+strconv.Itoa(i)), pid, []byte("x"))...)
		}
		if _, err := nc.Write(stream); err != nil {
			return
		}
		for {
			fh, body, err := mqttwire.ReadPacket(r, 0, nil)
			if err != nil || fh.Type == 14 {
				return
			}
			switch {
			case fh.Type == 4 && len(body) >= 2:
				acked <- uint16(body[0])<<8 | uint16(body[1])
			case fh.Type == 12:
				_, _ = nc.Write([]byte{0xD0, 0})
			}
		}
	}()
	b, rec := newRecordingBridge(t, fmt.Sprintf("    address: %q\n    protocol: \"3.1.1\"\n    ack_timeout: 20s\n", ln.Addr())+cmdRoute)
	b.Start(context.Background(), rec)
	t.Cleanup(b.Stop)
	for i := range n {
		select {
		case <-acked:
		case <-time.After(upWait):
			t.Fatalf("%d of %d messages acknowledged upstream", i, n)
		}
	}
	b.Stop()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var want []string
	for i := range n {
		want = append(want, "local/"+strconv.Itoa(i))
	}
	if !slices.Equal(rec.topics, want) {
		t.Errorf("delivered %v, want %v: each was acknowledged upstream", rec.topics, want)
	}
}
