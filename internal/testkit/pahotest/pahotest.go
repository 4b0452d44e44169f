// Package pahotest connects Eclipse Paho clients, an MQTT implementation
// not ours, to a broker under test or an upstream: watchers that
// subscribe and hand over every message they get (MQTT 5 and 3.1.1), and
// a plain MQTT 5 client that publishes and waits for the acknowledgement.
// Each disconnects when the test ends. Every wait is bounded by Wait on
// the suite's time scale.
package pahotest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/fieldgate/fieldgate/internal/testkit"
)

// Wait bounds every wait on the broker: far above what any step takes on
// an idle machine, on the suite's time scale.
var Wait = testkit.Scale(20 * time.Second)

// V5Watcher is a Paho MQTT 5 client that watches a broker: every
// PUBLISH it gets arrives on Msgs.
type V5Watcher struct {
	*paho.Client
	Msgs chan *paho.Publish
}

// WatchV5 connects a Paho MQTT 5 client to addr and subscribes it to
// filter at qos. It disconnects when the test ends.
func WatchV5(t testing.TB, addr, id, filter string, qos byte) *V5Watcher {
	t.Helper()
	w := &V5Watcher{Msgs: make(chan *paho.Publish, 4096)}
	w.Client = Connect(t, addr, id, func(pr paho.PublishReceived) (bool, error) {
		w.Msgs <- pr.Packet
		return true, nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), Wait)
	defer cancel()
	ack, err := w.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: qos}}})
	if err != nil {
		t.Fatalf("paho subscribe %q: %v", filter, err)
	}
	if len(ack.Reasons) != 1 || ack.Reasons[0] >= 0x80 {
		t.Fatalf("paho subscribe %q: reasons %v", filter, ack.Reasons)
	}
	return w
}

// Next returns the next message the watcher gets, failing the test after
// Wait.
func (w *V5Watcher) Next(t testing.TB) *paho.Publish {
	t.Helper()
	select {
	case m := <-w.Msgs:
		return m
	case <-time.After(Wait):
		t.Fatalf("paho watcher: no message within %v", Wait)
		return nil
	}
}

// Connect connects a Paho MQTT 5 client to addr, with onPublish for what
// it receives (nil: none expected).
func Connect(t testing.TB, addr, id string, onPublish func(paho.PublishReceived) (bool, error)) *paho.Client {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, Wait)
	if err != nil {
		t.Fatalf("paho dial %s: %v", addr, err)
	}
	cfg := paho.ClientConfig{Conn: nc, PacketTimeout: Wait}
	if onPublish != nil {
		cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){onPublish}
	}
	c := paho.NewClient(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), Wait)
	defer cancel()
	if _, err := c.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}); err != nil {
		nc.Close()
		t.Fatalf("paho connect %q to %s: %v", id, addr, err)
	}
	t.Cleanup(func() { _ = c.Disconnect(&paho.Disconnect{}) })
	return c
}

// Publish publishes one message with a Paho MQTT 5 client and waits for
// its acknowledgement.
func Publish(t testing.TB, c *paho.Client, topic string, qos byte, payload []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Wait)
	defer cancel()
	if _, err := c.Publish(ctx, &paho.Publish{Topic: topic, QoS: qos, Payload: payload}); err != nil {
		t.Fatalf("paho publish to %q: %v", topic, err)
	}
}

// V311Watcher is a Paho MQTT 3.1.1 client that watches a broker.
type V311Watcher struct {
	mqtt.Client
	Msgs chan mqtt.Message
}

// WatchV311 connects a Paho MQTT 3.1.1 client to addr and subscribes it
// to filter at qos. It disconnects when the test ends.
func WatchV311(t testing.TB, addr, id, filter string, qos byte) *V311Watcher {
	t.Helper()
	w := &V311Watcher{Msgs: make(chan mqtt.Message, 4096)}
	o := mqtt.NewClientOptions().
		AddBroker("tcp://" + addr).
		SetClientID(id).
		SetProtocolVersion(4).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectTimeout(Wait).
		SetWriteTimeout(Wait).
		SetOrderMatters(true).
		SetDefaultPublishHandler(func(_ mqtt.Client, m mqtt.Message) { w.Msgs <- m })
	w.Client = mqtt.NewClient(o)
	if tok := w.Connect(); !tok.WaitTimeout(Wait) || tok.Error() != nil {
		t.Fatalf("paho 3.1.1 connect %q to %s: %v", id, addr, tok.Error())
	}
	t.Cleanup(func() { w.Disconnect(100) })
	if tok := w.Subscribe(filter, qos, nil); !tok.WaitTimeout(Wait) || tok.Error() != nil {
		t.Fatalf("paho 3.1.1 subscribe %q: %v", filter, tok.Error())
	}
	return w
}

// Next returns the next message the watcher gets, failing the test after
// Wait.
func (w *V311Watcher) Next(t testing.TB) mqtt.Message {
	t.Helper()
	select {
	case m := <-w.Msgs:
		return m
	case <-time.After(Wait):
		t.Fatalf("paho 3.1.1 watcher: no message within %v", Wait)
		return nil
	}
}
