package broker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/storage"
	"github.com/mochi-mqtt/server/v2/packets"
)

// storedBroker is a broker on a state file that a test can restart.
type storedBroker struct {
	t    *testing.T
	path string
	edit func(*Options)
	tb   *testBroker
	db   *storage.DB
	addr string
}

func newStoredBroker(t *testing.T, edit func(*Options)) *storedBroker {
	sb := &storedBroker{t: t, path: filepath.Join(t.TempDir(), "state.db"), edit: edit}
	sb.start()
	t.Cleanup(sb.stop)
	return sb
}

// start opens the state file and starts a broker on it, on the same port
// as before when there was one.
func (sb *storedBroker) start() {
	sb.t.Helper()
	db, err := storage.Open(sb.path, storage.Options{LazyDelay: 50 * time.Millisecond})
	if err != nil {
		sb.t.Fatalf("storage.Open: %v", err)
	}
	sb.db = db
	opts := Options{Config: DefaultConfig(), Version: "test", Store: db, QueuePolicy: storage.QueueDropOldest}
	opts.AllowAnonymous = true
	opts.SysInterval = 0
	addr := sb.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	opts.Listeners = []Listener{{Name: "tcp", Type: ListenerTCP, Address: addr}}
	if sb.edit != nil {
		sb.edit(&opts)
	}
	b, err := New(opts, nil)
	if err != nil {
		sb.t.Fatalf("broker.New: %v", err)
	}
	if err := b.Start(); err != nil {
		sb.t.Fatalf("broker.Start: %v", err)
	}
	sb.tb = &testBroker{Broker: b, Addr: b.Addr("tcp").String()}
	sb.addr = sb.tb.Addr
}

// stop shuts the broker down and closes the state file.
func (sb *storedBroker) stop() {
	if sb.tb == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Scale(10*time.Second))
	defer cancel()
	_ = sb.tb.Shutdown(ctx)
	if err := sb.db.Close(); err != nil {
		sb.t.Errorf("storage close: %v", err)
	}
	sb.tb = nil
}

func (sb *storedBroker) restart() {
	sb.stop()
	sb.start()
}

// TestPersistSessionAcrossRestart: a persistent session's subscriptions
// and the QoS 1 messages queued while it was away survive a restart, and
// so do retained messages.
func TestPersistSessionAcrossRestart(t *testing.T) {
	sb := newStoredBroker(t, nil)
	sub, _ := connectRaw(t, sb.addr, 5, "keeper", true, v5Expiry(3600))
	sub.subscribe(1, packets.Subscription{Filter: "p/#", Qos: 1})
	sub.disconnect(0)
	v5WaitOffline(t, sb.tb.Broker, "keeper")

	pub, _ := connectRaw(t, sb.addr, 5, "writer", true, nil)
	for i := range 5 {
		pub.publish(rawPublish("p/t", fmt.Sprint(i), 1, false, uint16(i+1)))
	}
	pub.publish(rawPublish("p/state", "on", 1, true, 10))
	pub.close()

	sb.restart()

	c, ack := connectRaw(t, sb.addr, 5, "keeper", false, v5Expiry(3600))
	if !ack.SessionPresent {
		t.Fatal("session not present after restart")
	}
	for i := range 5 {
		c.ackPublish(c.expectPublish("p/t", fmt.Sprint(i), 1))
	}
	// The retained message was published after the subscription, so it
	// came as a live message (retain flag as published only with RAP).
	c.ackPublish(c.expectPublish("p/state", "on", 1))
	c.quiet()

	fresh, _ := connectRaw(t, sb.addr, 5, "fresh", true, nil)
	fresh.subscribe(1, packets.Subscription{Filter: "p/+", Qos: 1})
	m := fresh.expectPublish("p/state", "on", 1)
	if !m.FixedHeader.Retain {
		t.Fatal("retained message lost its retain flag after restart")
	}
	fresh.ackPublish(m)
}

// TestPersistInboundQoS2AcrossRestart: a QoS 2 PUBLISH acknowledged with
// PUBREC before a restart is known after it: the client's resend is not
// delivered again [MQTT-4.3.3-10], and PUBREL completes it.
func TestPersistInboundQoS2AcrossRestart(t *testing.T) {
	sb := newStoredBroker(t, nil)
	sub, _ := connectRaw(t, sb.addr, 5, "q2-sub", true, v5Expiry(3600))
	sub.subscribe(1, packets.Subscription{Filter: "q2/#", Qos: 2})
	sub.disconnect(0)
	v5WaitOffline(t, sb.tb.Broker, "q2-sub")

	pub, _ := connectRaw(t, sb.addr, 5, "q2-pub", true, v5Expiry(3600))
	pub.send(rawPublish("q2/t", "once", 2, false, 7))
	pub.expectAck(packets.Pubrec, 7, 0)
	pub.close()

	sb.restart()

	pub, ack := connectRaw(t, sb.addr, 5, "q2-pub", false, v5Expiry(3600))
	if !ack.SessionPresent {
		t.Fatal("publisher's session not present after restart")
	}
	again := rawPublish("q2/t", "once", 2, false, 7)
	again.FixedHeader.Dup = true
	pub.send(again)
	pub.expectAck(packets.Pubrec, 7, 0)
	pub.send(rawAck(packets.Pubrel, 7, 0))
	pub.expectAck(packets.Pubcomp, 7, 0)

	c, _ := connectRaw(t, sb.addr, 5, "q2-sub", false, v5Expiry(3600))
	m := c.expectPublish("q2/t", "once", 2)
	c.send(rawAck(packets.Pubrec, m.PacketID, 0))
	c.expectAck(packets.Pubrel, m.PacketID, 0)
	c.send(rawAck(packets.Pubcomp, m.PacketID, 0))
	c.quiet() // exactly once
}

// TestPersistOutboundQoS2AcrossRestart: a QoS 2 message whose PUBREC the
// subscriber sent before a restart gets PUBREL after it, not the message.
func TestPersistOutboundQoS2AcrossRestart(t *testing.T) {
	sb := newStoredBroker(t, nil)
	c, _ := connectRaw(t, sb.addr, 5, "out2", true, v5Expiry(3600))
	c.subscribe(1, packets.Subscription{Filter: "o2/#", Qos: 2})
	pub, _ := connectRaw(t, sb.addr, 5, "out2-pub", true, nil)
	pub.publish(rawPublish("o2/t", "x", 2, false, 1))
	m := c.expectPublish("o2/t", "x", 2)
	c.send(rawAck(packets.Pubrec, m.PacketID, 0))
	c.expectAck(packets.Pubrel, m.PacketID, 0)
	c.close()
	v5WaitOffline(t, sb.tb.Broker, "out2")

	sb.restart()

	c, _ = connectRaw(t, sb.addr, 5, "out2", false, v5Expiry(3600))
	c.expectAck(packets.Pubrel, m.PacketID, 0)
	c.send(rawAck(packets.Pubcomp, m.PacketID, 0))
	c.quiet()
}

// TestPersistQueueRefused: with queue_policy refuse, a message that does
// not fit a persistent session's budget is refused to an MQTT 5 publisher
// with 0x97 instead of a PUBACK for something not stored.
func TestPersistQueueRefused(t *testing.T) {
	sb := newStoredBroker(t, func(o *Options) {
		o.QueuePolicy = storage.QueueRefuse
		o.MaxQueuedBytes = 1024
		o.MaxPacketSize = 1024
	})
	sub, _ := connectRaw(t, sb.addr, 5, "small", true, v5Expiry(3600))
	sub.subscribe(1, packets.Subscription{Filter: "f/#", Qos: 1})
	sub.disconnect(0)
	v5WaitOffline(t, sb.tb.Broker, "small")

	pub, _ := connectRaw(t, sb.addr, 5, "filler", true, nil)
	payload := string(make([]byte, 300))
	var refused bool
	for i := range 10 {
		pub.send(rawPublish("f/t", payload, 1, false, uint16(i+1)))
		ack := pub.expect(packets.Puback)
		if ack.ReasonCode == rcQuotaExceeded {
			refused = true
			break
		}
		if ack.ReasonCode != 0 {
			t.Fatalf("PUBACK reason 0x%02X", ack.ReasonCode)
		}
	}
	if !refused {
		t.Fatal("ten 300-byte messages into a 1 KiB queue were all accepted")
	}
}

// TestPersistDropOldest: with drop_oldest, a full queue makes room by
// dropping its oldest QoS 1 messages; the newest arrive.
func TestPersistDropOldest(t *testing.T) {
	sb := newStoredBroker(t, func(o *Options) {
		o.MaxQueuedBytes = 1024
		o.MaxPacketSize = 1024
	})
	sub, _ := connectRaw(t, sb.addr, 5, "dropper", true, v5Expiry(3600))
	sub.subscribe(1, packets.Subscription{Filter: "d/#", Qos: 1})
	sub.disconnect(0)
	v5WaitOffline(t, sb.tb.Broker, "dropper")
	pub, _ := connectRaw(t, sb.addr, 5, "filler", true, nil)
	pad := string(make([]byte, 300))
	for i := range 10 {
		pub.publish(rawPublish("d/t", fmt.Sprintf("%d%s", i, pad), 1, false, uint16(i+1)))
	}
	sb.restart()
	c, _ := connectRaw(t, sb.addr, 5, "dropper", false, v5Expiry(3600))
	got := recvPrefixes(c, 1)
	if len(got) == 0 || len(got) >= 10 || got[len(got)-1] != "9" {
		t.Fatalf("after overflow got %v; want the newest few, ending with 9", got)
	}
}

// TestPersistSessionExpiresAcrossRestart: a session whose expiry runs out
// while the broker is down (or after it restarts) is removed on time, and
// its will, waiting for a longer delay, goes out when the session ends
// [MQTT-3.1.3-9].
func TestPersistSessionExpiresAcrossRestart(t *testing.T) {
	sb := newStoredBroker(t, nil)
	c, _ := connectRaw(t, sb.addr, 5, "mortal", true, func(pk *packets.Packet) {
		v5SetExpiry(pk, 2)
		pk.Connect.WillFlag = true
		pk.Connect.WillTopic = "wills/mortal"
		pk.Connect.WillPayload = []byte("gone")
		pk.Connect.WillQos = 1
		pk.Connect.WillProperties.WillDelayInterval = 100
	})
	c.close() // abnormal: the will waits for its delay or the session's end
	v5WaitOffline(t, sb.tb.Broker, "mortal")

	sb.restart()

	w, _ := connectRaw(t, sb.addr, 5, "watcher", true, nil)
	w.subscribe(1, packets.Subscription{Filter: "wills/#", Qos: 1})
	pk, err := w.recv(6 * time.Second)
	if err != nil || pk.FixedHeader.Type != packets.Publish || string(pk.Payload) != "gone" {
		t.Fatalf("will at session expiry after a restart: %v %v", pk, err)
	}
	w.ackPublish(pk)
	sb.tb.Broker.mu.Lock()
	_, still := sb.tb.Broker.sessions["mortal"]
	sb.tb.Broker.mu.Unlock()
	if still {
		t.Fatal("expired session still held")
	}
	sb.stop()
	db, err := storage.OpenReadOnly(sb.path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_ = db.Load(func(st *storage.SessionState) error {
		if st.ClientID == "mortal" {
			t.Errorf("expired session still in the state file")
		}
		return nil
	})
}

// TestPersistDiskFull: with the state file on a full file system, QoS 1
// publishes that must be stored are refused with 0x97 (MQTT 5) while QoS 0
// traffic goes on, and storing works again once there is room, without a
// restart.
func TestPersistDiskFull(t *testing.T) {
	dir := testkit.SmallTmpfs(t, "2m")
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, make([]byte, 512<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	sb := &storedBroker{t: t, path: filepath.Join(dir, "state.db"), edit: func(o *Options) { o.MaxPacketSize = 64 << 10 }}
	sb.start()
	t.Cleanup(sb.stop)

	live, _ := connectRaw(t, sb.addr, 5, "live", true, nil)
	live.subscribe(1, packets.Subscription{Filter: "live/#", Qos: 0})
	pub, _ := connectRaw(t, sb.addr, 5, "filler", true, nil)
	big := string(make([]byte, 32<<10))
	full := false
	for i := 1; i <= 200 && !full; i++ {
		pub.send(rawPublish(fmt.Sprintf("keep/%d", i), big, 1, true, uint16(i)))
		ack := pub.expect(packets.Puback)
		switch ack.ReasonCode {
		case 0:
		case rcQuotaExceeded:
			full = true
		default:
			t.Fatalf("PUBACK 0x%02X while filling", ack.ReasonCode)
		}
	}
	if !full {
		t.Fatal("200 × 32 KiB retained messages fit a 2 MiB file system")
	}
	// QoS 0 without durable effects still flows.
	pub.send(rawPublish("live/x", "still here", 0, false, 0))
	live.expectPublish("live/x", "still here", 0)

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	pub.send(rawPublish("keep/after", "room again", 1, true, 500))
	if ack := pub.expect(packets.Puback); ack.ReasonCode != 0 {
		t.Fatalf("after freeing space: PUBACK 0x%02X, want 0", ack.ReasonCode)
	}
	sb.restart()
	fresh, _ := connectRaw(t, sb.addr, 5, "fresh", true, nil)
	fresh.subscribe(1, packets.Subscription{Filter: "keep/after", Qos: 1})
	fresh.ackPublish(fresh.expectPublish("keep/after", "room again", 1))
}

// TestRetainedHeapPerMessage: retained messages live in the state file, so
// the broker's heap does not grow with their payloads. The figure is
// logged; the bound is a tenth of the payload size.
func TestRetainedHeapPerMessage(t *testing.T) {
	sb := newStoredBroker(t, nil)
	pub := localConnect(t, sb.tb.Broker, "retainer")
	payload := make([]byte, 512)
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	const n = 5000
	before := heap()
	for i := range n {
		if err := pub.Publish(context.Background(), fmt.Sprintf("site/dev-%04d/state", i), payload, 1, true); err != nil {
			t.Fatal(err)
		}
	}
	after := heap()
	per := (int64(after) - int64(before)) / n
	t.Logf("heap per retained message: %d B (payload %d B, %d messages)", per, len(payload), n)
	if per > int64(len(payload))/10 {
		t.Fatalf("heap grew %d B per retained message of %d B: payloads are being held in memory", per, len(payload))
	}
	if got := sb.db.RetainedCount(); got != n {
		t.Fatalf("%d retained messages stored, want %d", got, n)
	}
}

// TestPersistBudgetLoweredAcrossRestart: messages queued under a larger
// budget than the one in force after a restart are all kept; with
// drop_oldest a new message replaces one old one, not the excess.
func TestPersistBudgetLoweredAcrossRestart(t *testing.T) {
	sb := newStoredBroker(t, func(o *Options) { o.MaxQueuedBytes = 64 << 10 })
	sub, _ := connectRaw(t, sb.addr, 5, "lowered", true, v5Expiry(3600))
	sub.subscribe(1, packets.Subscription{Filter: "l/#", Qos: 1})
	sub.disconnect(0)
	v5WaitOffline(t, sb.tb.Broker, "lowered")
	pub, _ := connectRaw(t, sb.addr, 5, "lowerer", true, nil)
	pad := string(make([]byte, 1000))
	const queued = 20 // about 2.3 KB each against the budget: 46 KB
	for i := range queued {
		pub.publish(rawPublish("l/t", fmt.Sprintf("%02d%s", i, pad), 1, false, uint16(i+1)))
	}
	sb.edit = func(o *Options) { o.MaxQueuedBytes = 16 << 10 }
	sb.restart()
	pub, _ = connectRaw(t, sb.addr, 5, "lowerer", true, nil)
	pub.publish(rawPublish("l/t", "NN"+pad, 1, false, 1))
	c, _ := connectRaw(t, sb.addr, 5, "lowered", false, v5Expiry(3600))
	got := recvPrefixes(c, 2)
	if len(got) != queued || got[0] != "01" || got[len(got)-1] != "NN" {
		t.Fatalf("got %d messages %v; want the %d restored ones but the oldest, then NN", len(got), got, queued)
	}
}

// recvPrefixes takes the PUBLISHes c gets until none comes for 500 ms,
// acknowledging each, and returns the first n bytes of their payloads.
func recvPrefixes(c *rawClient, n int) []string {
	var got []string
	for {
		pk, err := c.recv(500 * time.Millisecond)
		if err != nil {
			return got
		}
		if pk.FixedHeader.Type == packets.Publish {
			got = append(got, string(pk.Payload[:n]))
			c.ackPublish(pk)
		}
	}
}
