package pahotest

import (
	"testing"

	"github.com/fieldgate/fieldgate/internal/testkit/mosquitto"
)

// TestWatchers publishes through Connect and Publish and checks that both
// watchers get the message.
func TestWatchers(t *testing.T) {
	m := mosquitto.Start(t, mosquitto.Config{})
	w5 := WatchV5(t, m.Addr(), "w5", "t/#", 1)
	w3 := WatchV311(t, m.Addr(), "w3", "t/#", 1)
	pub := Connect(t, m.Addr(), "pub", nil)
	Publish(t, pub, "t/x", 1, []byte("hello"))
	if got := w5.Next(t); got.Topic != "t/x" || string(got.Payload) != "hello" {
		t.Errorf("MQTT 5 watcher got %q %q", got.Topic, got.Payload)
	}
	if got := w3.Next(t); got.Topic() != "t/x" || string(got.Payload()) != "hello" {
		t.Errorf("MQTT 3.1.1 watcher got %q %q", got.Topic(), got.Payload())
	}
}
