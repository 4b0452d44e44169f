package bridge

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/internal/testkit/wiretest"
)

// fakeUp is an upstream that misbehaves as real cloud brokers do and
// Mosquitto cannot be set to: it closes every link right after CONNACK,
// refuses MQTT 5 with a 3.1.1 return code (NATS), closes the link on a
// topic with a space in it (NATS), and can hold back each PUBACK until the
// next packet comes, so that the acknowledgement of the message before a
// refused one is lost with the link. It is a real TCP server speaking
// enough MQTT through internal/mqttwire: CONNECT, PUBLISH at QoS 0 to 2,
// PUBREL, SUBSCRIBE, PINGREQ and DISCONNECT.
type fakeUp struct {
	ln net.Listener

	mu       sync.Mutex
	mode     fakeMode
	dials    []time.Time // when each connection came
	versions []byte      // the protocol version of each CONNECT
	got      []string    // the topics of the PUBLISHes acknowledged (or taken, at QoS 0), in order
	conns    map[net.Conn]bool
}

// fakeMode is what fakeUp does; change it with set.
type fakeMode struct {
	closeAfterConnack bool // close each link right after CONNACK
	refuseV5          bool // answer an MQTT 5 CONNECT with 3.1.1's return code 1
	closeOnSpace      bool // close the link on a PUBLISH whose topic has a space
	lagAcks           bool // hold each PUBACK until the next packet; a close drops it
}

func startFakeUp(t *testing.T, mode fakeMode) *fakeUp {
	t.Helper()
	ln, wg := wiretest.Listen(t)
	f := &fakeUp{ln: ln, mode: mode, conns: map[net.Conn]bool{}}
	t.Cleanup(f.closeAll)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.dials = append(f.dials, time.Now())
			f.conns[nc] = true
			f.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer f.drop(nc)
				f.serve(nc)
			}()
		}
	}()
	return f
}

func (f *fakeUp) addr() string { return f.ln.Addr().String() }

func (f *fakeUp) set(mode fakeMode) {
	f.mu.Lock()
	f.mode = mode
	f.mu.Unlock()
}

func (f *fakeUp) drop(nc net.Conn) {
	nc.Close()
	f.mu.Lock()
	delete(f.conns, nc)
	f.mu.Unlock()
}

// closeAll closes every link, as a server going away does.
func (f *fakeUp) closeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for nc := range f.conns {
		nc.Close()
	}
}

func (f *fakeUp) dialTimes() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.dials...)
}

func (f *fakeUp) connectVersions() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]byte(nil), f.versions...)
}

func (f *fakeUp) topics() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.got...)
}

func (f *fakeUp) serve(nc net.Conn) {
	r := bufio.NewReader(nc)
	fh, body, err := mqttwire.ReadPacket(r, 0, nil)
	if err != nil || fh.Type != packets.Connect || len(body) < 7 {
		return
	}
	v := body[6] // after the protocol name "MQTT" and its length
	f.mu.Lock()
	f.versions = append(f.versions, v)
	mode := f.mode
	f.mu.Unlock()
	v5 := v == 5
	switch {
	case v5 && mode.refuseV5:
		_, _ = nc.Write([]byte{0x20, 2, 0, 1}) // what NATS says [MQTT-3.1.2-2]
		return
	case v5:
		_, _ = nc.Write([]byte{0x20, 3, 0, 0, 0})
	default:
		_, _ = nc.Write([]byte{0x20, 2, 0, 0})
	}
	if mode.closeAfterConnack {
		return
	}
	var lagged []byte // a PUBACK held back
	for {
		fh, body, err := mqttwire.ReadPacket(r, 0, nil)
		if err != nil {
			return
		}
		var out []byte
		if lagged != nil {
			out, lagged = append(out, lagged...), nil
		}
		pk := packets.Packet{FixedHeader: fh, ProtocolVersion: v}
		switch fh.Type {
		case packets.Publish:
			if err := mqttwire.Decode(&pk, body); err != nil {
				return
			}
			if mode.closeOnSpace && strings.Contains(pk.TopicName, " ") {
				return // as NATS does, the ack held back lost with it
			}
			f.mu.Lock()
			f.got = append(f.got, pk.TopicName)
			f.mu.Unlock()
			switch fh.Qos {
			case 1:
				ack := mqttwire.Ack(packets.Puback, pk.PacketID, 0, v5, "")
				if mode.lagAcks {
					lagged = ack
				} else {
					out = append(out, ack...)
				}
			case 2:
				out = append(out, mqttwire.Ack(packets.Pubrec, pk.PacketID, 0, v5, "")...)
			}
		case packets.Pubrel:
			if err := mqttwire.Decode(&pk, body); err != nil {
				return
			}
			out = append(out, mqttwire.Ack(packets.Pubcomp, pk.PacketID, 0, v5, "")...)
		case packets.Subscribe:
			if err := mqttwire.Decode(&pk, body); err != nil {
				return
			}
			ack := append([]byte{byte(pk.PacketID >> 8), byte(pk.PacketID)}, make([]byte, len(pk.Filters))...)
			if v5 {
				ack = append(ack[:2:2], append([]byte{0}, ack[2:]...)...)
			}
			out = append(out, wiretest.Frame(packets.Suback<<4, ack)...)
		case packets.Pingreq:
			out = append(out, 0xD0, 0)
		case packets.Disconnect:
			return
		}
		if len(out) > 0 {
			if _, err := nc.Write(out); err != nil {
				return
			}
		}
	}
}

// logRecord is one line a bridge logged.
type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

// logRecorder is a slog.Handler that keeps every record, for tests that
// count what the bridge said.
type logRecorder struct {
	mu   *sync.Mutex
	recs *[]logRecord
	with []slog.Attr
}

func newLogRecorder() *logRecorder {
	return &logRecorder{mu: &sync.Mutex{}, recs: &[]logRecord{}}
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	for _, a := range h.with {
		rec.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	h.mu.Lock()
	*h.recs = append(*h.recs, rec)
	h.mu.Unlock()
	return nil
}

func (h *logRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	return &logRecorder{mu: h.mu, recs: h.recs, with: append(append([]slog.Attr(nil), h.with...), as...)}
}

func (h *logRecorder) WithGroup(string) slog.Handler { return h }

// find returns the records at level or above whose message contains s.
func (h *logRecorder) find(level slog.Level, s string) []logRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []logRecord
	for _, r := range *h.recs {
		if r.level >= level && strings.Contains(r.msg, s) {
			out = append(out, r)
		}
	}
	return out
}
