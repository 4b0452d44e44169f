package mqttclient

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit/faultproxy"
	"github.com/fieldgate/fieldgate/internal/testkit/mosquitto"
)

// TestClientPing: Ping returns once Mosquitto answers, several at once
// included, and with the connection's error when the server goes silent.
func TestClientPing(t *testing.T) {
	m := mosquitto.Start(t, mosquitto.Config{})
	p := faultproxy.New(t, m.Addr())
	c := dial(t, Options{Address: p.Addr(), ClientID: "ping", AckTimeout: 2 * time.Second})
	errs := make(chan error, 3)
	for range 3 {
		go func() { errs <- c.Ping(context.Background()) }()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatalf("Ping: %v", err)
		}
	}
	p.Freeze()
	if err := c.Ping(context.Background()); !errors.Is(err, ErrHalfOpen) {
		t.Errorf("Ping of a silent server: %v, want ErrHalfOpen", err)
	}
	if err := c.Ping(context.Background()); !errors.Is(err, ErrHalfOpen) {
		t.Errorf("Ping after the end: %v, want the connection's error", err)
	}
}

// TestClientClaim: a claimed identifier is taken by nothing else, and a
// Publish or Release under it uses the claim, even with the window full.
func TestClientClaim(t *testing.T) {
	m := mosquitto.Start(t, mosquitto.Config{})
	c := dial(t, Options{Address: m.Addr(), ClientID: "claim", MaxInflight: 2})
	if err := c.Claim([]uint16{1, 2}); err != nil {
		t.Fatal(err)
	}
	if err := c.Claim([]uint16{2}); err == nil {
		t.Error("an identifier claimed twice")
	}
	if _, err := c.Publish(&Outgoing{Topic: "claim/new", QoS: 1}, nil); !errors.Is(err, ErrWindowFull) {
		t.Errorf("a new publish with the window claimed: %v, want ErrWindowFull", err)
	}
	done := make(chan result, 2)
	pid, err := c.Publish(&Outgoing{Topic: "claim/old", QoS: 1, PacketID: 2, Dup: true}, func(err error, reason byte) { done <- result{err, reason} })
	if err != nil || pid != 2 {
		t.Fatalf("publish under the claimed id 2: pid %d, %v", pid, err)
	}
	if r := <-done; r.err != nil {
		t.Fatalf("publish under the claimed id: %v", r.err)
	}
	// Mosquitto answers a PUBREL it holds nothing for with PUBCOMP.
	if err := c.Release(1, func(err error, reason byte) { done <- result{err, reason} }); err != nil {
		t.Fatalf("release under the claimed id 1: %v", err)
	}
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("release under the claimed id: %v", r.err)
		}
	case <-time.After(upWait):
		t.Fatal("no PUBCOMP")
	}
	r := publishWait(t, c, &Outgoing{Topic: "claim/after", QoS: 1})
	if r.err != nil {
		t.Fatalf("publish once the claims are used: %v", r.err)
	}
}
