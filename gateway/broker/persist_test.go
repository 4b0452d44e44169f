package broker

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/gateway/config"
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
	opts := Options{Broker: config.Default().Broker, Version: "test", Store: db, QueuePolicy: config.QueueDropOldest}
	opts.AllowAnonymous = true
	opts.SysInterval = 0
	addr := sb.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	opts.Listeners = []config.Listener{{Name: "tcp", Type: config.ListenerTCP, Address: addr}}
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
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
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
		o.QueuePolicy = config.QueueRefuse
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
	var got []string
	for {
		pk, err := c.recv(500 * time.Millisecond)
		if err != nil {
			break
		}
		if pk.FixedHeader.Type == packets.Publish {
			got = append(got, string(pk.Payload[:1]))
			c.ackPublish(pk)
		}
	}
	if len(got) == 0 || len(got) >= 10 || got[len(got)-1] != "9" {
		t.Fatalf("after overflow got %v; want the newest few, ending with 9", got)
	}
}
