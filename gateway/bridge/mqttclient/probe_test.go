package mqttclient

import (
	"bufio"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/internal/testkit/faultproxy"
	"github.com/fieldgate/fieldgate/internal/testkit/mosquitto"
	"github.com/fieldgate/fieldgate/internal/testkit/wiretest"
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

// TestClientKeepAliveAfterPing: a keep alive that falls due while a Ping
// is unanswered is not skipped. The server here answers that PINGREQ
// late, then holds the PUBACK of the message published next until the
// client sends another packet; only the next keep alive's PINGREQ, due a
// keep alive after the publish [MQTT-3.1.2-23], releases it. A watchdog
// that slept until the Ping's ack deadline would send it an ack timeout
// late instead.
func TestClientKeepAliveAfterPing(t *testing.T) {
	const keepAlive, ackTimeout = 2 * time.Second, 30 * time.Second
	ln, wg := wiretest.Listen(t)
	wg.Add(1)
	go func() {
		defer wg.Done()
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		r := bufio.NewReader(nc)
		if fh, _, err := mqttwire.ReadPacket(r, 0, nil); err != nil || fh.Type != packets.Connect {
			return
		}
		_, _ = nc.Write([]byte{0x20, 2, 0, 0})
		var held []byte
		pings := 0
		for {
			fh, body, err := mqttwire.ReadPacket(r, 0, nil)
			if err != nil {
				return
			}
			out := held
			held = nil
			switch fh.Type {
			case packets.Pingreq:
				if pings++; pings == 1 {
					time.Sleep(keepAlive + keepAlive/4) // past the keep alive
				}
				out = append(out, 0xD0, 0)
			case packets.Publish:
				pk := packets.Packet{FixedHeader: fh, ProtocolVersion: 4}
				if mqttwire.Decode(&pk, body) != nil {
					return
				}
				held = mqttwire.Ack(packets.Puback, pk.PacketID, 0, false, "")
			}
			if _, err := nc.Write(out); err != nil {
				return
			}
		}
	}()
	c := dial(t, Options{Address: ln.Addr().String(), Protocol: 4, ClientID: "keepalive", KeepAlive: keepAlive, AckTimeout: ackTimeout})
	if err := c.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	done := make(chan result, 1)
	start := time.Now()
	if _, err := c.Publish(&Outgoing{Topic: "a", Payload: []byte("x"), QoS: 1}, func(err error, reason byte) { done <- result{err, reason} }); err != nil {
		t.Fatal(err)
	}
	// Generous for a busy machine, and far short of the ack timeout.
	if r := <-done; r.err != nil || time.Since(start) > ackTimeout/3 {
		t.Errorf("PUBACK after %v (%v): the keep alive's PINGREQ came late", time.Since(start).Round(time.Millisecond), r.err)
	}
}
