package mqttclient

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/internal/testkit/faultproxy"
	"github.com/fieldgate/fieldgate/internal/testkit/mosquitto"
	"github.com/fieldgate/fieldgate/internal/testkit/pahotest"
	"github.com/fieldgate/fieldgate/internal/testkit/wiretest"
)

// The upstream client against a real broker (Mosquitto, from
// internal/testkit/mosquitto), watched and fed by Paho clients
// (pahotest). The one test double is the 3.1.1-only server of
// TestClientFallback, since Mosquitto cannot be told to refuse MQTT 5.

// upWaitBase bounds every wait on the upstream in tests: far above what
// any step takes on an idle machine. upWait is it on the suite's time
// scale, so that a loaded machine does not fail a correct run.
const upWaitBase = 20 * time.Second

var upWait = testkit.Scale(upWaitBase)

// waitFor polls cond until it holds, failing the test after upWait.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testkit.WaitFor(t, upWaitBase, what, cond)
}

// dial connects a client with the test's generous timeouts unless o sets
// its own, and closes it when the test ends.
func dial(t testing.TB, o Options) *Client {
	t.Helper()
	if o.ConnectTimeout == 0 {
		o.ConnectTimeout = upWait
	}
	if o.AckTimeout == 0 {
		o.AckTimeout = upWait
	}
	c, err := Dial(context.Background(), o)
	if err != nil {
		t.Fatalf("dial %s: %v", o.Address, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// result is what a done callback got.
type result struct {
	err    error
	reason byte
}

// publishWait publishes m and waits for its done callback.
func publishWait(t testing.TB, c *Client, m *Outgoing) result {
	t.Helper()
	ch := make(chan result, 1)
	if _, err := c.Publish(m, func(err error, reason byte) { ch <- result{err, reason} }); err != nil {
		t.Fatalf("publish to %q: %v", m.Topic, err)
	}
	select {
	case r := <-ch:
		return r
	case <-time.After(upWait):
		t.Fatalf("publish to %q: no done within %v", m.Topic, upWait)
		return result{}
	}
}

// waitDone waits for the connection to end, failing the test after d.
func waitDone(t testing.TB, c *Client, d time.Duration) {
	t.Helper()
	select {
	case <-c.Done():
	case <-time.After(d):
		t.Fatalf("connection still up after %v", d)
	}
}

// stillUp fails the test if the connection has ended.
func stillUp(t testing.TB, c *Client) {
	t.Helper()
	select {
	case <-c.Done():
		t.Fatalf("connection ended: %v", c.Err())
	default:
	}
}

// inbox collects what OnMessage gets.
type inbox struct {
	mu   sync.Mutex
	msgs []*Incoming
}

func (b *inbox) add(m *Incoming) {
	b.mu.Lock()
	b.msgs = append(b.msgs, m)
	b.mu.Unlock()
}

func (b *inbox) all() []*Incoming {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.msgs)
}

func (b *inbox) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.msgs)
}

func TestClientConnectV5Info(t *testing.T) {
	m := mosquitto.Start(t, mosquitto.Config{})
	c := dial(t, Options{Address: m.Addr(), Protocol: 0, KeepAlive: 30 * time.Second, MaxInflight: 5})
	info := c.Info()
	t.Logf("Mosquitto's CONNACK: %+v", info)
	if info.Version != 5 {
		t.Errorf("Version %d, want 5 (Protocol 0 tries 5 first)", info.Version)
	}
	if info.SessionPresent {
		t.Error("SessionPresent on a new client id")
	}
	if info.AssignedClientID == "" {
		t.Error("no AssignedClientID for an empty ClientID")
	}
	// Mosquitto's max_inflight_messages defaults to 20 and is its
	// Receive Maximum.
	if info.ReceiveMaximum != 20 {
		t.Errorf("ReceiveMaximum %d, want Mosquitto's default 20", info.ReceiveMaximum)
	}
	if !info.SubIDsAvailable || info.MaxQoS != 2 || !info.RetainAvailable || info.MaxPacketSize != 0 {
		t.Errorf("SubIDsAvailable %t, MaxQoS %d, RetainAvailable %t, MaxPacketSize %d; want true, 2, true, 0",
			info.SubIDsAvailable, info.MaxQoS, info.RetainAvailable, info.MaxPacketSize)
	}
	if c.Window() != 5 {
		t.Errorf("Window %d, want MaxInflight 5 below Receive Maximum %d", c.Window(), info.ReceiveMaximum)
	}

	c4 := dial(t, Options{Address: m.Addr(), Protocol: 4, ClientID: "v311"})
	info = c4.Info()
	if info.Version != 4 || info.ReceiveMaximum != 65535 || info.SubIDsAvailable || info.MaxQoS != 2 {
		t.Errorf("3.1.1 Info %+v, want Version 4, ReceiveMaximum 65535, no subscription ids, MaxQoS 2", info)
	}
	if c4.Window() != 65535 {
		t.Errorf("3.1.1 Window %d without MaxInflight, want 65535", c4.Window())
	}

	// Session present when coming back to a kept session.
	o := Options{Address: m.Addr(), ClientID: "keeper", SessionExpiry: time.Hour}
	dial(t, o).Close()
	if c := dial(t, o); !c.Info().SessionPresent {
		t.Error("SessionPresent false on reconnecting to a session with an hour's expiry")
	}
}

// fake311 is a test double of a server that speaks only MQTT 3.1.1: it
// answers an MQTT 5 CONNECT as mode says and accepts a 3.1.1 CONNECT.
// Mosquitto cannot be set to refuse MQTT 5, so the fallback is tested
// against this, and only the fallback.
type fake311 struct {
	ln       net.Listener
	mu       sync.Mutex
	versions []byte // the protocol version of each CONNECT, in order
}

func startFake311(t *testing.T, mode string) *fake311 {
	t.Helper()
	ln, wg := wiretest.Listen(t)
	f := &fake311{ln: ln}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer nc.Close()
				f.serve(nc, mode)
			}()
		}
	}()
	return f
}

func (f *fake311) serve(nc net.Conn, mode string) {
	_ = nc.SetDeadline(time.Now().Add(upWait))
	r := bufio.NewReader(nc)
	fh, body, err := mqttwire.ReadPacket(r, 0, nil)
	if err != nil || fh.Type != 1 || len(body) < 7 {
		return
	}
	v := body[6] // after the protocol name "MQTT" and its length
	f.mu.Lock()
	f.versions = append(f.versions, v)
	f.mu.Unlock()
	if v != 4 {
		switch mode {
		case "return code 1": // what a 3.1.1 server sends [MQTT-3.1.2-2]
			_, _ = nc.Write([]byte{0x20, 2, 0, 1})
		case "reason 0x84": // an MQTT 5 server that will not do 5 here
			_, _ = nc.Write([]byte{0x20, 3, 0, 0x84, 0})
		case "close":
		}
		return
	}
	_, _ = nc.Write([]byte{0x20, 2, 0, 0})
	for { // answer PINGREQ until the client goes
		fh, _, err := mqttwire.ReadPacket(r, 0, nil)
		if err != nil || fh.Type == 14 {
			return
		}
		if fh.Type == 12 {
			_, _ = nc.Write([]byte{0xD0, 0})
		}
	}
}

func (f *fake311) seen() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.versions)
}

func TestClientFallback(t *testing.T) {
	for _, mode := range []string{"return code 1", "reason 0x84", "close"} {
		t.Run(mode, func(t *testing.T) {
			f := startFake311(t, mode)
			c := dial(t, Options{Address: f.ln.Addr().String(), ClientID: "fb", Protocol: 0})
			if v := c.Info().Version; v != 4 {
				t.Errorf("Version %d after fallback, want 4", v)
			}
			if got := f.seen(); !slices.Equal(got, []byte{5, 4}) {
				t.Errorf("CONNECT versions %v, want [5 4]", got)
			}
			if c.Info().ReceiveMaximum != 65535 || c.Info().SubIDsAvailable {
				t.Errorf("3.1.1 Info %+v", c.Info())
			}
		})
	}
	t.Run("Protocol 5 does not fall back", func(t *testing.T) {
		f := startFake311(t, "return code 1")
		_, err := Dial(context.Background(), Options{Address: f.ln.Addr().String(), ClientID: "fb", Protocol: 5, ConnectTimeout: upWait})
		var re *RefusedError
		if !errors.Is(err, ErrRefused) || !errors.As(err, &re) || re.Code != 1 {
			t.Fatalf("err %v, want a refusal with return code 1", err)
		}
		if !strings.Contains(err.Error(), "unacceptable protocol version") {
			t.Errorf("error %q does not say what code 1 means", err)
		}
		if got := f.seen(); !slices.Equal(got, []byte{5}) {
			t.Errorf("CONNECT versions %v, want [5]", got)
		}
	})
}

func TestClientUserPassword(t *testing.T) {
	m := mosquitto.Start(t, mosquitto.Config{DenyAnonymous: true, Users: map[string]string{"gw": "s3cret"}})
	for _, v := range []byte{5, 4} {
		t.Run(versionName(v), func(t *testing.T) {
			c := dial(t, Options{Address: m.Addr(), Protocol: v, ClientID: "pw", Username: "gw", Password: []byte("s3cret")})
			if r := publishWait(t, c, &Outgoing{Topic: "pw/ok", QoS: 1}); r.err != nil {
				t.Fatalf("publish after login: %v", r.err)
			}
			for _, bad := range []Options{
				{Username: "gw", Password: []byte("wrong")},
				{}, // anonymous
			} {
				bad.Address, bad.Protocol, bad.ClientID, bad.ConnectTimeout = m.Addr(), v, "pw-bad", upWait
				_, err := Dial(context.Background(), bad)
				var re *RefusedError
				if !errors.As(err, &re) || !errors.Is(err, ErrRefused) {
					t.Fatalf("user %q: err %v, want a refusal", bad.Username, err)
				}
				// 0x86/0x87 (MQTT 5), 4/5 (3.1.1): bad credentials or
				// not authorized.
				want := []byte{0x86, 0x87}
				if v == 4 {
					want = []byte{4, 5}
				}
				if !slices.Contains(want, re.Code) {
					t.Errorf("user %q: code 0x%02X, want one of % X", bad.Username, re.Code, want)
				}
				t.Logf("user %q refused: %v", bad.Username, err)
			}
		})
	}
}

func TestClientTLS(t *testing.T) {
	m := mosquitto.Start(t, mosquitto.Config{TLS: true})
	t.Run("CA file and server name", func(t *testing.T) {
		c := dial(t, Options{Address: m.TLSAddr(), TLS: m.ClientTLS("localhost", false), ClientID: "tls"})
		if r := publishWait(t, c, &Outgoing{Topic: "tls/x", QoS: 1, Payload: []byte("over tls")}); r.err != nil || r.reason >= 0x80 {
			t.Fatalf("publish over TLS: %v, reason 0x%02X", r.err, r.reason)
		}
	})
	t.Run("server name from the address", func(t *testing.T) {
		// The certificate names 127.0.0.1 too.
		dial(t, Options{Address: m.TLSAddr(), TLS: m.ClientTLS("", false), ClientID: "tls-ip"})
	})
	t.Run("wrong server name", func(t *testing.T) {
		_, err := Dial(context.Background(), Options{Address: m.TLSAddr(), TLS: m.ClientTLS("broker.example", false), ClientID: "tls-bad", ConnectTimeout: upWait})
		if err == nil || !strings.Contains(err.Error(), "TLS handshake") {
			t.Fatalf("err %v, want a TLS handshake failure for a name the certificate lacks", err)
		}
	})
	t.Run("plain client on the TLS port", func(t *testing.T) {
		_, err := Dial(context.Background(), Options{Address: m.TLSAddr(), ClientID: "plain", Protocol: 5, ConnectTimeout: 3 * time.Second})
		if err == nil {
			t.Fatal("a plain MQTT client connected to the TLS listener")
		}
	})
}

func TestClientMutualTLS(t *testing.T) {
	m := mosquitto.Start(t, mosquitto.Config{TLS: true, RequireCertificate: true})
	c := dial(t, Options{Address: m.TLSAddr(), TLS: m.ClientTLS("localhost", true), ClientID: "mtls"})
	if r := publishWait(t, c, &Outgoing{Topic: "mtls/x", QoS: 2}); r.err != nil || r.reason >= 0x80 {
		t.Fatalf("publish over mutual TLS: %v, reason 0x%02X", r.err, r.reason)
	}
	for _, p := range []byte{5, 0} {
		_, err := Dial(context.Background(), Options{Address: m.TLSAddr(), TLS: m.ClientTLS("localhost", false), ClientID: "no-cert", Protocol: p, ConnectTimeout: upWait})
		if err == nil {
			t.Fatalf("Protocol %d: a client without a certificate connected where one is required", p)
		}
		t.Logf("Protocol %d without a client certificate: %v", p, err)
	}
}

func TestClientPublishQoS(t *testing.T) {
	m := mosquitto.Start(t, mosquitto.Config{})
	w := pahotest.WatchV5(t, m.Addr(), "watcher", "pub/#", 2)
	c := dial(t, Options{Address: m.Addr(), ClientID: "pub", KeepAlive: 30 * time.Second})
	for qos := byte(0); qos <= 2; qos++ {
		payload := fmt.Appendf(nil, "payload at QoS %d", qos)
		topic := fmt.Sprintf("pub/q%d", qos)
		r := publishWait(t, c, &Outgoing{Topic: topic, QoS: qos, Payload: payload})
		if r.err != nil || r.reason != 0 {
			t.Fatalf("QoS %d: done(%v, 0x%02X), want success", qos, r.err, r.reason)
		}
		got := w.Next(t)
		if got.Topic != topic || string(got.Payload) != string(payload) || got.QoS != qos {
			t.Fatalf("watcher got %q %q QoS %d, want %q %q QoS %d", got.Topic, got.Payload, got.QoS, topic, payload, qos)
		}
	}
	if n := c.Inflight(); n != 0 {
		t.Errorf("Inflight %d after every publish completed", n)
	}
	// A QoS 1 PUBACK with 0x10 says nobody subscribed; done passes it on.
	if r := publishWait(t, c, &Outgoing{Topic: "nobody/listens", QoS: 1}); r.err != nil || r.reason != 0x10 {
		t.Errorf("publish to a topic without subscribers: done(%v, 0x%02X), want 0x10", r.err, r.reason)
	}
	// A bad topic is refused before anything is sent.
	if _, err := c.Publish(&Outgoing{Topic: "pub/+", QoS: 1}, nil); err == nil {
		t.Error("Publish to a topic with a wildcard succeeded")
	}
	stillUp(t, c)
}

// TestClientWindow publishes 100 QoS 1 messages as fast as Publish takes
// them to a Mosquitto whose Receive Maximum is 10.
func TestClientWindow(t *testing.T) {
	m := mosquitto.Start(t, mosquitto.Config{MaxInflight: 10})
	w := pahotest.WatchV5(t, m.Addr(), "watcher", "win/#", 1)
	c := dial(t, Options{Address: m.Addr(), ClientID: "win", MaxInflight: 1000})
	if c.Info().ReceiveMaximum != 10 || c.Window() != 10 {
		t.Fatalf("Receive Maximum %d, Window %d; want 10 and 10", c.Info().ReceiveMaximum, c.Window())
	}
	const n = 100
	results := make(chan result, n)
	freed := make(chan struct{}, n)
	maxSeen, full := 0, 0
	for i := 0; i < n; {
		_, err := c.Publish(&Outgoing{Topic: "win/x", QoS: 1, Payload: fmt.Appendf(nil, "%03d", i)}, func(err error, reason byte) {
			results <- result{err, reason}
			freed <- struct{}{}
		})
		if errors.Is(err, ErrWindowFull) {
			full++
			select {
			case <-freed:
			case <-time.After(upWait):
				t.Fatalf("window full and no PUBACK within %v", upWait)
			}
			continue
		}
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		maxSeen = max(maxSeen, c.Inflight())
		i++
	}
	for range n {
		select {
		case r := <-results:
			if r.err != nil || r.reason >= 0x80 {
				t.Fatalf("done(%v, 0x%02X)", r.err, r.reason)
			}
		case <-time.After(upWait):
			t.Fatal("not every publish completed")
		}
	}
	if maxSeen > 10 {
		t.Errorf("Inflight reached %d, above the server's Receive Maximum 10", maxSeen)
	}
	t.Logf("Inflight peaked at %d; Publish said ErrWindowFull %d times", maxSeen, full)
	seen := make(map[string]bool)
	for len(seen) < n {
		seen[string(w.Next(t).Payload)] = true
	}
	stillUp(t, c)
}

func TestClientSubscriptionIDs(t *testing.T) {
	m := mosquitto.Start(t, mosquitto.Config{})
	var in inbox
	c := dial(t, Options{Address: m.Addr(), ClientID: "sid", OnMessage: in.add})
	reasons, err := c.Subscribe(context.Background(), []Subscription{
		{Filter: "sid/#", QoS: 1, ID: 1},
		{Filter: "sid/+/x", QoS: 2, ID: 2},
		{Filter: "plain/#", QoS: 0},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(reasons, []byte{1, 2, 0}) {
		t.Fatalf("SUBACK reasons % X, want 01 02 00", reasons)
	}
	pub := pahotest.Connect(t, m.Addr(), "sid-pub", nil)

	// sid/a/x matches both filters: the identifiers of both must come,
	// in one PUBLISH or one each.
	pahotest.Publish(t, pub, "sid/a/x", 1, []byte("both"))
	ids := map[int]bool{}
	waitFor(t, "identifiers 1 and 2 for sid/a/x", func() bool {
		clear(ids)
		for _, m := range in.all() {
			for _, id := range m.SubIDs {
				ids[id] = true
			}
		}
		return ids[1] && ids[2]
	})
	copies := in.len()
	t.Logf("Mosquitto delivered sid/a/x in %d PUBLISH(es): %v", copies, func() (s [][]int) {
		for _, m := range in.all() {
			s = append(s, m.SubIDs)
		}
		return s
	}())
	if len(ids) != 2 {
		t.Errorf("identifiers %v, want only 1 and 2", ids)
	}

	pahotest.Publish(t, pub, "sid/b", 1, []byte("one"))
	pahotest.Publish(t, pub, "plain/c", 1, []byte("none"))
	waitFor(t, "two more messages", func() bool { return in.len() == copies+2 })
	got := in.all()[copies:]
	if got[0].Topic != "sid/b" || !slices.Equal(got[0].SubIDs, []int{1}) {
		t.Errorf("sid/b came with identifiers %v, want [1]", got[0].SubIDs)
	}
	if got[1].Topic != "plain/c" || len(got[1].SubIDs) != 0 {
		t.Errorf("plain/c came with identifiers %v, want none", got[1].SubIDs)
	}

	if err := c.Unsubscribe(context.Background(), []string{"sid/#", "sid/+/x", "never/subscribed"}); err != nil {
		t.Fatalf("unsubscribe: %v", err)
	}
	pahotest.Publish(t, pub, "plain/after", 1, nil)
	pahotest.Publish(t, pub, "sid/after", 1, nil)
	waitFor(t, "plain/after", func() bool { return in.len() == copies+3 })
	time.Sleep(200 * time.Millisecond)
	for _, m := range in.all()[copies+2:] {
		if strings.HasPrefix(m.Topic, "sid/") {
			t.Errorf("got %s after unsubscribing from sid/#", m.Topic)
		}
	}
}

func TestClientInbound(t *testing.T) {
	m := mosquitto.Start(t, mosquitto.Config{})
	var in inbox
	var inHandler atomic.Int32
	c := dial(t, Options{Address: m.Addr(), ClientID: "in", OnMessage: func(m *Incoming) {
		if inHandler.Add(1) != 1 {
			panic("OnMessage called concurrently")
		}
		time.Sleep(20 * time.Millisecond) // a slow handler: the acks wait for it
		in.add(m)
		inHandler.Add(-1)
	}})
	if _, err := c.Subscribe(context.Background(), []Subscription{{Filter: "in/#", QoS: 2}}); err != nil {
		t.Fatal(err)
	}
	pub := pahotest.Connect(t, m.Addr(), "in-pub", nil)
	for i := range 5 {
		pahotest.Publish(t, pub, fmt.Sprintf("in/q1/%d", i), 1, []byte("one"))
		pahotest.Publish(t, pub, fmt.Sprintf("in/q2/%d", i), 2, []byte("two"))
	}
	waitFor(t, "ten messages", func() bool { return in.len() >= 10 })
	waitFor(t, "every PUBREL", func() bool { return c.received.Len() == 0 })
	time.Sleep(300 * time.Millisecond) // room for a duplicate to show
	got := in.all()
	if len(got) != 10 {
		t.Fatalf("%d messages, want 10, each once", len(got))
	}
	for _, m := range got {
		want := byte(1)
		if strings.HasPrefix(m.Topic, "in/q2/") {
			want = 2
		}
		if m.QoS != want {
			t.Errorf("%s arrived at QoS %d, want %d", m.Topic, m.QoS, want)
		}
	}
}

// TestClientInboundQoS2AcrossReconnect loses our PUBREC with the link (the
// proxy freezes while OnMessage runs), so the server resends the PUBLISH
// on the next connection. Sharing Received delivers it once; a fresh one
// delivers it twice, which shows the test would notice.
func TestClientInboundQoS2AcrossReconnect(t *testing.T) {
	for _, shared := range []bool{true, false} {
		t.Run(fmt.Sprintf("shared %t", shared), func(t *testing.T) {
			m := mosquitto.Start(t, mosquitto.Config{})
			p := faultproxy.New(t, m.Addr())
			var count atomic.Int32
			onMsg := func(*Incoming) {
				if count.Add(1) == 1 {
					p.Freeze() // the PUBREC goes nowhere
				}
			}
			var recv Received
			o := Options{Address: p.Addr(), ClientID: "q2", SessionExpiry: time.Hour, OnMessage: onMsg, Received: &recv}
			a := dial(t, o)
			if _, err := a.Subscribe(context.Background(), []Subscription{{Filter: "q2/#", QoS: 2}}); err != nil {
				t.Fatal(err)
			}
			pahotest.Publish(t, pahotest.Connect(t, m.Addr(), "q2-pub", nil), "q2/x", 2, []byte("once"))
			waitFor(t, "PUBREC recorded", func() bool { return recv.Len() == 1 })
			a.Close()

			o.Address = m.Addr()
			if !shared {
				o.Received = &Received{}
			}
			b := dial(t, o)
			if !b.Info().SessionPresent {
				t.Fatal("no session on reconnect")
			}
			waitFor(t, "the PUBREL", func() bool { return o.Received.Len() == 0 && count.Load() >= 1 })
			time.Sleep(300 * time.Millisecond)
			want := int32(1)
			if !shared {
				want = 2
			}
			if n := count.Load(); n != want {
				t.Fatalf("delivered %d times, want %d", n, want)
			}
		})
	}
}

func TestClientKeepAlive(t *testing.T) {
	m := mosquitto.Start(t, mosquitto.Config{})
	p := faultproxy.New(t, m.Addr())
	c := dial(t, Options{Address: p.Addr(), ClientID: "ka", KeepAlive: time.Second, AckTimeout: 5 * time.Second})
	before := p.UpSent()
	// Mosquitto drops a client silent for 1.5 keep alive periods; 2.0.11
	// notices some seconds late (5.5 s for a 1 s keep alive here).
	time.Sleep(7 * time.Second)
	stillUp(t, c)
	if pings := (p.UpSent() - before) / 2; pings < 4 {
		t.Errorf("%d PINGREQs in 7s of idle link with a 1s keep alive", pings)
	}
	if r := publishWait(t, c, &Outgoing{Topic: "ka/x", QoS: 1}); r.err != nil {
		t.Fatalf("publish after idling: %v", r.err)
	}
}

func TestClientHalfOpenPing(t *testing.T) {
	m := mosquitto.Start(t, mosquitto.Config{})
	p := faultproxy.New(t, m.Addr())
	const ka, ackTimeout = time.Second, time.Second
	c := dial(t, Options{Address: p.Addr(), ClientID: "ho", KeepAlive: ka, AckTimeout: ackTimeout})
	start := time.Now()
	p.Freeze()
	waitDone(t, c, upWait)
	took := time.Since(start)
	if !errors.Is(c.Err(), ErrHalfOpen) || !strings.Contains(c.Err().Error(), "PINGRESP") {
		t.Fatalf("Err %v, want ErrHalfOpen naming PINGRESP", c.Err())
	}
	// At most one keep alive until the PINGREQ, one ack timeout for the
	// PINGRESP; the slack is for a loaded machine.
	if took > ka+ackTimeout+3*time.Second {
		t.Errorf("half-open link found after %v, want about %v", took, ka+ackTimeout)
	}
	t.Logf("found after %v: %v", took, c.Err())
	if _, err := c.Publish(&Outgoing{Topic: "ho/x", QoS: 1}, nil); !errors.Is(err, ErrHalfOpen) {
		t.Errorf("Publish after the end: %v, want the connection's error", err)
	}
}

func TestClientHalfOpenWrite(t *testing.T) {
	m := mosquitto.Start(t, mosquitto.Config{})
	p := faultproxy.New(t, m.Addr())
	c := dial(t, Options{Address: p.Addr(), ClientID: "how", AckTimeout: time.Second})
	p.Freeze()
	payload := make([]byte, 64<<10)
	var sent atomic.Int32
	var doneErr atomic.Value
	start := time.Now()
	for i := 0; ; i++ {
		if i == 4000 { // 256 MB: far past any socket buffer
			t.Fatal("QoS 0 publishes still accepted into a frozen link")
		}
		_, err := c.Publish(&Outgoing{Topic: "how/x", Payload: payload}, func(err error, _ byte) {
			if err != nil {
				doneErr.Store(err)
			} else {
				sent.Add(1)
			}
		})
		if err != nil {
			if !errors.Is(err, ErrHalfOpen) || !strings.Contains(err.Error(), "write") {
				t.Fatalf("Publish: %v, want ErrHalfOpen for a blocked write", err)
			}
			break
		}
	}
	waitDone(t, c, upWait)
	if !errors.Is(c.Err(), ErrHalfOpen) {
		t.Fatalf("Err %v, want ErrHalfOpen", c.Err())
	}
	if e, _ := doneErr.Load().(error); !errors.Is(e, ErrHalfOpen) {
		t.Errorf("the done of an unwritten QoS 0 message got %v, want the connection's error", e)
	}
	t.Logf("%d messages of 64 KiB written before the link blocked; ended after %v: %v", sent.Load(), time.Since(start), c.Err())
}

func TestClientServerStop(t *testing.T) {
	m := mosquitto.Start(t, mosquitto.Config{})
	clients := map[byte]*Client{}
	for _, v := range []byte{5, 4} {
		clients[v] = dial(t, Options{Address: m.Addr(), Protocol: v, ClientID: fmt.Sprintf("stop%d", v), KeepAlive: 30 * time.Second})
	}
	m.Stop()
	for v, c := range clients {
		waitDone(t, c, upWait)
		err := c.Err()
		if err == nil || errors.Is(err, ErrHalfOpen) || errors.Is(err, ErrClosed) {
			t.Errorf("%s: Err %v, want the server's end of the connection", versionName(v), err)
		}
		var de *DisconnectError
		if errors.As(err, &de) && de.Code != 0x8B {
			t.Errorf("%s: DISCONNECT 0x%02X, want 0x8B (server shutting down)", versionName(v), de.Code)
		}
		t.Logf("%s: %v", versionName(v), err)
		if _, err := c.Publish(&Outgoing{Topic: "x", QoS: 1}, nil); err == nil {
			t.Errorf("%s: Publish after the end succeeded", versionName(v))
		}
	}
}

// TestClientResend breaks the link with messages unacknowledged (the
// proxy holds them) and finishes them on a new connection with the
// session present: QoS 1 and 2 resent with Dup and their packet ids, and a
// QoS 2 message that had its PUBREC released with Release. The watcher
// must get every message, the QoS 2 ones once.
func TestClientResend(t *testing.T) {
	m := mosquitto.Start(t, mosquitto.Config{})
	w := pahotest.WatchV5(t, m.Addr(), "watcher", "re/#", 2)
	p := faultproxy.New(t, m.Addr())
	o := Options{Address: p.Addr(), ClientID: "re", SessionExpiry: time.Hour}
	a := dial(t, o)

	// The QoS 2 message whose PUBREL is held: the proxy passes exactly
	// its PUBLISH, and the PUBREC comes back.
	rel := &Outgoing{Topic: "re/rel", QoS: 2, Payload: []byte("released")}
	limit := p.UpSent() + int64(wiretest.PublishSize(rel.Topic, len(rel.Payload), rel.QoS, 5))
	p.HoldUpAfter(limit)
	relDone := make(chan result, 1)
	relPID, err := a.Publish(rel, func(err error, reason byte) { relDone <- result{err, reason} })
	if err != nil {
		t.Fatal(err)
	}
	// Nothing else goes up (no keep alive): what is held past the
	// PUBLISH is the PUBREL.
	waitFor(t, "the PUBREL held in the proxy", func() bool { return p.UpSent() == limit && p.Held() >= 4 })

	p.Freeze()
	type pending struct {
		m    *Outgoing
		pid  uint16
		done chan result
	}
	var lost []pending
	for i := range 6 {
		msg := &Outgoing{Topic: fmt.Sprintf("re/%d", i), QoS: byte(1 + i%2), Payload: fmt.Appendf(nil, "m%d", i)}
		d := make(chan result, 1)
		pid, err := a.Publish(msg, func(err error, reason byte) { d <- result{err, reason} })
		if err != nil {
			t.Fatal(err)
		}
		lost = append(lost, pending{msg, pid, d})
	}
	if n := a.Inflight(); n != 7 {
		t.Errorf("Inflight %d, want 7", n)
	}
	a.Close()
	if r := <-relDone; !errors.Is(r.err, ErrClosed) || !errors.Is(r.err, ErrReleasePending) {
		t.Fatalf("done of the QoS 2 message past PUBREC: %v, want ErrClosed and ErrReleasePending", r.err)
	}
	for _, l := range lost {
		if r := <-l.done; !errors.Is(r.err, ErrClosed) || errors.Is(r.err, ErrReleasePending) {
			t.Fatalf("done of %s: %v, want ErrClosed alone", l.m.Topic, r.err)
		}
	}

	o.Address = m.Addr() // the proxy stays frozen; the broker takes the session over
	b := dial(t, o)
	if !b.Info().SessionPresent {
		t.Fatal("no session present on reconnect")
	}
	relDone2 := make(chan result, 1)
	if err := b.Release(relPID, func(err error, reason byte) { relDone2 <- result{err, reason} }); err != nil {
		t.Fatal(err)
	}
	for i := range lost {
		l := &lost[i]
		l.m.PacketID, l.m.Dup = l.pid, true
		l.done = make(chan result, 1)
		d := l.done
		if pid, err := b.Publish(l.m, func(err error, reason byte) { d <- result{err, reason} }); err != nil || pid != l.pid {
			t.Fatalf("resend %s: pid %d, %v; want pid %d", l.m.Topic, pid, err, l.pid)
		}
	}
	if r := <-relDone2; r.err != nil || r.reason != 0 {
		t.Errorf("Release: done(%v, 0x%02X), want PUBCOMP success (the server kept the id)", r.err, r.reason)
	}
	for _, l := range lost {
		if r := <-l.done; r.err != nil || r.reason >= 0x80 {
			t.Errorf("resend %s: done(%v, 0x%02X)", l.m.Topic, r.err, r.reason)
		}
	}
	got := map[string]int{}
	for len(got) < 7 {
		got[string(w.Next(t).Payload)]++
	}
	time.Sleep(300 * time.Millisecond)
drain:
	for {
		select {
		case m := <-w.Msgs:
			got[string(m.Payload)]++
		default:
			break drain
		}
	}
	for _, name := range []string{"released", "m1", "m3", "m5"} {
		if got[name] != 1 {
			t.Errorf("QoS 2 message %s arrived %d times, want once", name, got[name])
		}
	}
	for _, name := range []string{"m0", "m2", "m4"} {
		if got[name] < 1 {
			t.Errorf("QoS 1 message %s lost", name)
		}
	}
}

func TestClientServerLimits(t *testing.T) {
	m := mosquitto.Start(t, mosquitto.Config{
		Global:   []string{"max_packet_size 2000", "retain_available false"},
		Listener: []string{"max_qos 1"},
	})
	w := pahotest.WatchV5(t, m.Addr(), "watcher", "lim/#", 2)
	c := dial(t, Options{Address: m.Addr(), ClientID: "lim"})
	info := c.Info()
	if info.MaxQoS != 1 || info.RetainAvailable || info.MaxPacketSize != 2000 {
		t.Fatalf("Info %+v, want MaxQoS 1, no retain, MaxPacketSize 2000", info)
	}
	// QoS 2 goes as QoS 1; Mosquitto would disconnect us for a QoS 2.
	if r := publishWait(t, c, &Outgoing{Topic: "lim/q2", QoS: 2, Payload: []byte("down")}); r.err != nil || r.reason >= 0x80 {
		t.Fatalf("QoS 2 publish downgraded: done(%v, 0x%02X)", r.err, r.reason)
	}
	if got := w.Next(t); got.QoS != 1 {
		t.Errorf("watcher got QoS %d, want 1", got.QoS)
	}
	// Retain goes without the flag; Mosquitto would disconnect us for it.
	if r := publishWait(t, c, &Outgoing{Topic: "lim/r", QoS: 1, Retain: true, Payload: []byte("r")}); r.err != nil || r.reason >= 0x80 {
		t.Fatalf("retained publish: done(%v, 0x%02X)", r.err, r.reason)
	}
	w.Next(t)
	// Too large: an error, and the connection stays.
	if _, err := c.Publish(&Outgoing{Topic: "lim/big", QoS: 1, Payload: make([]byte, 3000)}, nil); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("3000-byte publish: %v, want ErrTooLarge", err)
	}
	if r := publishWait(t, c, &Outgoing{Topic: "lim/small", QoS: 1, Payload: make([]byte, 1900)}); r.err != nil || r.reason >= 0x80 {
		t.Fatalf("publish below the limit: done(%v, 0x%02X)", r.err, r.reason)
	}
	if got := w.Next(t); got.Topic != "lim/small" {
		t.Errorf("watcher got %s, want lim/small", got.Topic)
	}
	stillUp(t, c)
}

func TestClientV311(t *testing.T) {
	m := mosquitto.Start(t, mosquitto.Config{})
	w := pahotest.WatchV311(t, m.Addr(), "watcher311", "v3/out/#", 2)
	var in inbox
	c := dial(t, Options{Address: m.Addr(), Protocol: 4, ClientID: "v3", KeepAlive: 30 * time.Second, OnMessage: in.add})
	if _, err := c.Subscribe(context.Background(), []Subscription{{Filter: "v3/in/#", QoS: 2, ID: 7}}); err == nil {
		t.Error("a subscription identifier on 3.1.1 was accepted")
	}
	reasons, err := c.Subscribe(context.Background(), []Subscription{{Filter: "v3/in/#", QoS: 2}, {Filter: "v3/other", QoS: 1}})
	if err != nil || !slices.Equal(reasons, []byte{2, 1}) {
		t.Fatalf("subscribe: % X, %v; want 02 01", reasons, err)
	}
	for qos := byte(0); qos <= 2; qos++ {
		topic := fmt.Sprintf("v3/out/%d", qos)
		if r := publishWait(t, c, &Outgoing{Topic: topic, QoS: qos, Payload: []byte(topic)}); r.err != nil {
			t.Fatalf("publish %s: %v", topic, r.err)
		}
		if got := w.Next(t); got.Topic() != topic || got.Qos() != qos {
			t.Fatalf("watcher got %s QoS %d, want %s QoS %d", got.Topic(), got.Qos(), topic, qos)
		}
	}
	for qos := byte(1); qos <= 2; qos++ {
		if tok := w.Publish(fmt.Sprintf("v3/in/%d", qos), qos, false, "in"); !tok.WaitTimeout(upWait) || tok.Error() != nil {
			t.Fatalf("paho publish: %v", tok.Error())
		}
	}
	waitFor(t, "two inbound messages", func() bool { return in.len() == 2 })
	for _, m := range in.all() {
		if m.Props != nil || m.SubIDs != nil {
			t.Errorf("3.1.1 message %s with MQTT 5 fields", m.Topic)
		}
	}
	if err := c.Unsubscribe(context.Background(), []string{"v3/in/#"}); err != nil {
		t.Fatal(err)
	}
}

func TestClientClose(t *testing.T) {
	m := mosquitto.Start(t, mosquitto.Config{})
	p := faultproxy.New(t, m.Addr())
	c := dial(t, Options{Address: p.Addr(), ClientID: "close"})
	p.Freeze()
	d := make(chan result, 1)
	if _, err := c.Publish(&Outgoing{Topic: "close/x", QoS: 1}, func(err error, reason byte) { d <- result{err, reason} }); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Close took %v on a frozen link", took)
	}
	if r := <-d; !errors.Is(r.err, ErrClosed) {
		t.Errorf("done of an unacknowledged publish: %v, want ErrClosed", r.err)
	}
	if c.Err() != nil {
		t.Errorf("Err %v after a clean Close, want nil", c.Err())
	}
	if _, err := c.Publish(&Outgoing{Topic: "close/x"}, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Publish after Close: %v, want ErrClosed", err)
	}
	if _, err := c.Subscribe(context.Background(), []Subscription{{Filter: "a"}}); !errors.Is(err, ErrClosed) {
		t.Errorf("Subscribe after Close: %v, want ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestClientSubscribeContext gives up waiting for a SUBACK that the frozen
// proxy holds, and the watchdog then ends the connection.
func TestClientSubscribeContext(t *testing.T) {
	m := mosquitto.Start(t, mosquitto.Config{})
	p := faultproxy.New(t, m.Addr())
	c := dial(t, Options{Address: p.Addr(), ClientID: "subctx", AckTimeout: 2 * time.Second})
	p.Freeze()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := c.Subscribe(ctx, []Subscription{{Filter: "a/#"}}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Subscribe: %v, want the context's deadline", err)
	}
	waitDone(t, c, upWait)
	if err := c.Err(); !errors.Is(err, ErrHalfOpen) || !strings.Contains(err.Error(), "SUBACK") {
		t.Fatalf("Err %v, want ErrHalfOpen naming the SUBACK", err)
	}
}

// TestClientDialOptions checks that bad options are all reported at once,
// and that ConnectTimeout and the context bound the wait for CONNACK.
func TestClientDialOptions(t *testing.T) {
	_, err := Dial(context.Background(), Options{Address: "nohost", Protocol: 3, MaxInflight: -1, Will: &Will{Topic: "a/#", QoS: 3}})
	if err == nil {
		t.Fatal("bad options accepted")
	}
	for _, want := range []string{"Address", "Protocol 3", "MaxInflight", "Will.Topic", "Will.QoS"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	// A frozen link: the TCP connection opens, the CONNECT goes nowhere.
	p := faultproxy.New(t, mosquitto.Start(t, mosquitto.Config{}).Addr())
	p.Freeze()
	start := time.Now()
	_, err = Dial(context.Background(), Options{Address: p.Addr(), ConnectTimeout: 500 * time.Millisecond})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "CONNACK") {
		t.Errorf("frozen link: %v, want a deadline waiting for CONNACK", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	_, err = Dial(ctx, Options{Address: p.Addr(), ConnectTimeout: upWait})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled Dial: %v, want context.Canceled", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("ConnectTimeout 500ms took %v", took)
	}
}

// TestClientWill checks that the will reaches a watcher when the link
// dies without DISCONNECT.
func TestClientWill(t *testing.T) {
	m := mosquitto.Start(t, mosquitto.Config{})
	w := pahotest.WatchV5(t, m.Addr(), "watcher", "will/#", 1)
	p := faultproxy.New(t, m.Addr())
	dial(t, Options{Address: p.Addr(), ClientID: "will", KeepAlive: 30 * time.Second, Will: &Will{Topic: "will/gw", Payload: []byte("offline"), QoS: 1}})
	p.Close() // the link dies without a DISCONNECT
	if got := w.Next(t); got.Topic != "will/gw" || string(got.Payload) != "offline" {
		t.Fatalf("watcher got %s %q, want the will", got.Topic, got.Payload)
	}
}

// TestClientServerDisconnect has the server end the connection with a
// DISCONNECT. Mosquitto 2.0.11 sends one only for a client's fault (not on
// shutdown or takeover), and Publish avoids those, so the test slips a
// QoS 2 PUBLISH past Publish's downgrade onto a max_qos 1 listener.
func TestClientServerDisconnect(t *testing.T) {
	m := mosquitto.Start(t, mosquitto.Config{Listener: []string{"max_qos 1"}})
	c := dial(t, Options{Address: m.Addr(), ClientID: "faulty"})
	c.q.push(outPacket{b: []byte{0x34, 6, 0, 1, 'a', 0, 1, 0}}, false) // QoS 2, packet id 1, no properties
	waitDone(t, c, upWait)
	var de *DisconnectError
	if !errors.As(c.Err(), &de) || de.Code != 0x9B || !strings.Contains(c.Err().Error(), packets.ErrQosNotSupported.Reason) {
		t.Fatalf("Err %v, want the server's DISCONNECT naming 0x9B, QoS not supported", c.Err())
	}
	t.Logf("%v", c.Err())
}

// TestClientHeldRelease: with OnPubrec the PUBREL waits for ReleaseHeld;
// reserved identifiers take places in the window.
func TestClientHeldRelease(t *testing.T) {
	up := mosquitto.Start(t, mosquitto.Config{})
	w := pahotest.WatchV5(t, up.Addr(), "watcher", "h/#", 2)
	recs := make(chan uint16, 4)
	c := dial(t, Options{Address: up.Addr(), ClientID: "held", MaxInflight: 3, OnPubrec: func(pid uint16) { recs <- pid }})

	r1, err := c.ReserveID()
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c.ReserveID()
	if err != nil || r2 == r1 {
		t.Fatalf("second reservation %d, %v (first %d)", r2, err, r1)
	}
	done := make(chan result, 2)
	pid, err := c.Publish(&Outgoing{Topic: "h/a", QoS: 2, Payload: []byte("a"), PacketID: r1}, func(err error, reason byte) { done <- result{err, reason} })
	if err != nil || pid != r1 {
		t.Fatalf("publish under a reserved id: %d, %v; want %d", pid, err, r1)
	}
	if _, err := c.ReserveID(); err != nil {
		t.Fatalf("third place: %v", err)
	}
	if _, err := c.Publish(&Outgoing{Topic: "h/x", QoS: 1}, nil); !errors.Is(err, ErrWindowFull) {
		t.Errorf("publish with the window reserved: %v, want ErrWindowFull", err)
	}
	if _, err := c.ReserveID(); !errors.Is(err, ErrWindowFull) {
		t.Errorf("reservation beyond the window: %v, want ErrWindowFull", err)
	}
	c.CancelID(r2)
	if _, err := c.Publish(&Outgoing{Topic: "h/b", QoS: 1, Payload: []byte("b")}, nil); err != nil {
		t.Errorf("publish after CancelID: %v", err)
	}

	var got uint16
	select {
	case got = <-recs:
	case <-time.After(upWait):
		t.Fatal("no PUBREC")
	}
	if got != r1 {
		t.Fatalf("OnPubrec(%d), want %d", got, r1)
	}
	// Mosquitto delivers a QoS 2 message when it is released: nothing
	// arrives, and nothing completes, while the PUBREL is held.
	time.Sleep(300 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("done(%v, 0x%02X) with the PUBREL held", r.err, r.reason)
	default:
	}
	for len(w.Msgs) > 0 {
		if m := <-w.Msgs; string(m.Payload) == "a" {
			t.Fatal("delivered with the PUBREL held")
		}
	}
	if err := c.ReleaseHeld(r1 + 100); err == nil {
		t.Error("ReleaseHeld of an identifier with nothing held succeeded")
	}
	if err := c.ReleaseHeld(r1); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.err != nil || r.reason != 0 {
		t.Errorf("done(%v, 0x%02X), want PUBCOMP", r.err, r.reason)
	}
	for {
		m := w.Next(t)
		if string(m.Payload) == "a" {
			break
		}
	}

	// Held when the link ends: the message is past PUBREC.
	pid, err = c.Publish(&Outgoing{Topic: "h/c", QoS: 2, Payload: []byte("c")}, func(err error, reason byte) { done <- result{err, reason} })
	if err != nil {
		t.Fatal(err)
	}
	if got := <-recs; got != pid {
		t.Fatalf("OnPubrec(%d), want %d", got, pid)
	}
	c.Close()
	if r := <-done; !errors.Is(r.err, ErrReleasePending) {
		t.Errorf("done of a held message at close: %v, want ErrReleasePending", r.err)
	}
}
