package broker

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// MQTT 5.0 conformance of Will Messages: when they are sent, when not,
// their delay and their properties.

// v5Will is a connectRaw edit that gives the client a QoS 1 will on topic;
// delay is the will delay interval in seconds, expiry the session expiry
// interval.
func v5Will(topic, payload string, delay, expiry uint32) func(*packets.Packet) {
	return func(pk *packets.Packet) {
		pk.Connect.WillFlag = true
		pk.Connect.WillTopic = topic
		pk.Connect.WillPayload = []byte(payload)
		pk.Connect.WillQos = 1
		pk.Connect.WillProperties.WillDelayInterval = delay
		if expiry > 0 {
			v5SetExpiry(pk, expiry)
		}
	}
}

// v5WillWatcher connects a client subscribed to topic at QoS 1.
func v5WillWatcher(t *testing.T, addr, topic string) *rawClient {
	t.Helper()
	w, _ := connectRaw(t, addr, 5, "watch-"+topic, true, nil)
	w.subscribe(1, packets.Subscription{Filter: topic, Qos: 1})
	return w
}

func TestV5WillOnConnectionEnd(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	for _, tc := range []struct {
		name string
		end  func(c *rawClient)
		sent bool
		spec string
	}{
		{"network failure", (*rawClient).close, true, "[MQTT-3.1.2-8]"},
		{"normal DISCONNECT", func(c *rawClient) { c.disconnect(0x00) }, false, "[MQTT-3.1.2-10] [MQTT-3.14.4-3]"},
		{"DISCONNECT with will", func(c *rawClient) { c.disconnect(0x04) }, true, "(§3.14.2.1, 0x04)"},
		// Only 0x00 discards the will [MQTT-3.14.4-3] (§3.1.2.5).
		{"DISCONNECT with an error", func(c *rawClient) { c.disconnect(0x80) }, true, "[MQTT-3.1.2-8]"},
		{"protocol error", func(c *rawClient) {
			c.send(c.connectPacket("w", true))
			c.expectDisconnect(rcProtocolError)
		}, true, "[MQTT-3.1.2-8]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			topic := "will/" + tc.name
			w := v5WillWatcher(t, tb.Addr, topic)
			c, _ := connectRaw(t, tb.Addr, 5, "w-"+tc.name, true, v5Will(topic, "bye", 0, 0))
			tc.end(c)
			pk, err := w.recv(rawQuiet)
			switch {
			case tc.sent && err != nil:
				t.Fatalf("no will: %v %s", err, tc.spec)
			case !tc.sent && err == nil:
				t.Fatalf("got %s, want no will %s", rawDescribe(pk), tc.spec)
			case tc.sent && (pk.TopicName != topic || string(pk.Payload) != "bye" || pk.FixedHeader.Qos != 1):
				t.Fatalf("got %s, want the will", rawDescribe(pk))
			}
			w.expectNone(rawQuiet) // once [MQTT-3.1.2-10]
		})
	}
}

func TestV5WillDiscardedOnDisconnect(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	w := v5WillWatcher(t, tb.Addr, "wdr/will")
	// Reconnecting the moment the broker closes the connection: the
	// DISCONNECT was read, so the will is gone however soon the new
	// connection takes the session over [MQTT-3.14.4-3].
	for range 100 {
		c, _ := connectRaw(t, tb.Addr, 5, "wdr", false, v5Will("wdr/will", "bye", 0, 60))
		c.disconnect(0x00)
		c.close()
	}
	w.quiet()
}

func TestV5WillDelay(t *testing.T) {
	t.Parallel()

	t.Run("reconnect within the delay", func(t *testing.T) {
		t.Parallel()
		tb := startBroker(t, nil)
		w := v5WillWatcher(t, tb.Addr, "wd/back")
		c, _ := connectRaw(t, tb.Addr, 5, "wd-back", true, v5Will("wd/back", "bye", 1, 60))
		c.close()
		v5WaitOffline(t, tb.Broker, "wd-back")
		connectRaw(t, tb.Addr, 5, "wd-back", false, v5Expiry(60))
		// Well past the delay: the will was cancelled [MQTT-3.1.3-9].
		w.expectNone(2 * time.Second)
	})

	// The will goes when its delay passes or its session ends, whichever
	// comes first (§3.1.2.5) [MQTT-3.1.2-8]; either takes 1 s here.
	for _, tc := range []struct {
		name          string
		delay, expiry uint32
	}{
		{"sent after the delay", 1, 60},
		{"session ends first", 3600, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tb := startBroker(t, nil)
			w := v5WillWatcher(t, tb.Addr, "wd/late")
			c, _ := connectRaw(t, tb.Addr, 5, "wd-late", true, v5Will("wd/late", "bye", tc.delay, tc.expiry))
			c.close()
			start := time.Now()
			w.expectPublish("wd/late", "bye", 1)
			if took := w.lastAt.Sub(start); took < 950*time.Millisecond {
				t.Errorf("will sent %v after the connection closed, before 1 s passed [MQTT-3.1.2-8]", took)
			}
		})
	}
}

func TestV5WillProperties(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	w := v5WillWatcher(t, tb.Addr, "wp/t")
	user := []packets.UserProperty{{Key: "a", Val: "1"}, {Key: "b", Val: "2"}, {Key: "a", Val: "3"}}
	c, _ := connectRaw(t, tb.Addr, 5, "wp", true, func(pk *packets.Packet) {
		v5Will("wp/t", "payload", 0, 0)(pk)
		pk.Connect.WillRetain = true
		wp := &pk.Connect.WillProperties
		wp.PayloadFormat, wp.PayloadFormatFlag = 1, true
		wp.MessageExpiryInterval = 60
		wp.ContentType = "text/plain"
		wp.ResponseTopic = "wp/reply"
		wp.CorrelationData = []byte{9, 8, 7}
		wp.User = user
	})
	c.close()

	check := func(who string, m *packets.Packet) {
		t.Helper()
		p := &m.Properties
		if !p.PayloadFormatFlag || p.PayloadFormat != 1 {
			t.Errorf("%s: payload format %d (present %t), want 1 (§3.1.3.2.3)", who, p.PayloadFormat, p.PayloadFormatFlag)
		}
		if p.MessageExpiryInterval < 1 || p.MessageExpiryInterval > 60 {
			t.Errorf("%s: message expiry %d, want up to 60 (§3.1.3.2.4)", who, p.MessageExpiryInterval)
		}
		if p.ContentType != "text/plain" || p.ResponseTopic != "wp/reply" || !bytes.Equal(p.CorrelationData, []byte{9, 8, 7}) {
			t.Errorf("%s: content type %q, response topic %q, correlation data % X (§3.1.3.2)", who, p.ContentType, p.ResponseTopic, p.CorrelationData)
		}
		if !slices.Equal(p.User, user) {
			t.Errorf("%s: user properties %v, want %v in order [MQTT-3.1.3-10]", who, p.User, user)
		}
	}
	m := w.expectPublish("wp/t", "payload", 1)
	check("live subscriber", m)
	w.ackPublish(m)

	// Will Retain 1: published as a retained message [MQTT-3.1.2-15].
	late, _ := connectRaw(t, tb.Addr, 5, "wp-late", true, nil)
	late.subscribe(1, packets.Subscription{Filter: "wp/t", Qos: 1})
	m = late.expectPublish("wp/t", "payload", 1)
	if !m.FixedHeader.Retain {
		t.Errorf("retained will sent on subscribe with RETAIN 0")
	}
	check("later subscriber", m)
}
