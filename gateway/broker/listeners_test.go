package broker

import (
	"context"
	"crypto/tls"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/fieldgate/fieldgate/gateway/broker/auth"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/internal/testkit/certs"
	"github.com/gorilla/websocket"
)

// wsNetConn lets an MQTT client speak over a WebSocket: every write is one
// binary message.
type wsNetConn struct {
	net.Conn
	ws *websocket.Conn
	mu sync.Mutex
	r  interface{ Read([]byte) (int, error) }
}

func (c *wsNetConn) Read(p []byte) (int, error) {
	for {
		if c.r == nil {
			_, r, err := c.ws.NextReader()
			if err != nil {
				return 0, err
			}
			c.r = r
		}
		n, err := c.r.Read(p)
		if err != nil {
			c.r = nil
			if n > 0 {
				return n, nil
			}
			continue
		}
		return n, nil
	}
}

func (c *wsNetConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.ws.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// lsConnect connects a paho client over nc and returns it with a channel
// of the payloads it receives.
func lsConnect(t *testing.T, nc net.Conn, id, user string) (*paho.Client, <-chan string) {
	t.Helper()
	got := make(chan string, 16)
	cl := paho.NewClient(paho.ClientConfig{
		Conn: nc,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			got <- pr.Packet.Topic + " " + string(pr.Packet.Payload)
			return true, nil
		}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Scale(5*time.Second))
	defer cancel()
	cp := &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true}
	if user != "" {
		cp.Username, cp.UsernameFlag = user, true
	}
	ca, err := cl.Connect(ctx, cp)
	if err != nil {
		t.Fatalf("connect %s: %v", id, err)
	}
	if ca.ReasonCode != 0 {
		t.Fatalf("connect %s: reason 0x%02X", id, ca.ReasonCode)
	}
	t.Cleanup(func() { _ = cl.Disconnect(&paho.Disconnect{}) })
	return cl, got
}

// lsRoundTrip subscribes on sub, publishes on pub, and checks delivery.
func lsRoundTrip(t *testing.T, sub *paho.Client, subGot <-chan string, pub *paho.Client, topic string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Scale(5*time.Second))
	defer cancel()
	sa, err := sub.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: topic, QoS: 1}}})
	if err != nil || sa.Reasons[0] != 1 {
		t.Fatalf("subscribe %s: %v %v", topic, err, sa)
	}
	if _, err := pub.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte("over the wire")}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	select {
	case m := <-subGot:
		if m != topic+" over the wire" {
			t.Fatalf("received %q", m)
		}
	case <-time.After(testkit.Scale(5 * time.Second)):
		t.Fatalf("message not delivered within %v", testkit.Scale(5*time.Second))
	}
}

func TestListenerKinds(t *testing.T) {
	pki := certs.New(t, "sensor-7")
	sock := filepath.Join(t.TempDir(), "mqtt.sock")
	tb := startBroker(t, func(o *Options) {
		tlsFiles := TLS{Cert: pki.ServerCert, Key: pki.ServerKey}
		o.Listeners = append(o.Listeners,
			Listener{Name: "tls", Type: ListenerTLS, Address: "127.0.0.1:0", TLS: tlsFiles},
			Listener{Name: "ws", Type: ListenerWS, Address: "127.0.0.1:0"},
			Listener{Name: "wss", Type: ListenerWSS, Address: "127.0.0.1:0", TLS: tlsFiles},
			Listener{Name: "unix", Type: ListenerUnix, Address: sock},
		)
	})
	clientTLS := &tls.Config{RootCAs: pki.Pool, ServerName: "127.0.0.1"}
	dial := map[string]func(t *testing.T) net.Conn{
		"tcp": func(t *testing.T) net.Conn { return mustDial(t, "tcp", tb.Addr) },
		"tls": func(t *testing.T) net.Conn {
			c, err := tls.Dial("tcp", tb.Broker.Addr("tls").String(), clientTLS)
			if err != nil {
				t.Fatal(err)
			}
			return c
		},
		"ws": func(t *testing.T) net.Conn {
			return dialWS(t, "ws://"+tb.Broker.Addr("ws").String()+"/mqtt", nil)
		},
		"wss": func(t *testing.T) net.Conn {
			return dialWS(t, "wss://"+tb.Broker.Addr("wss").String()+"/mqtt", clientTLS)
		},
		"unix": func(t *testing.T) net.Conn { return mustDial(t, "unix", sock) },
	}
	for _, kind := range []string{"tcp", "tls", "ws", "wss", "unix"} {
		t.Run(kind, func(t *testing.T) {
			sub, got := lsConnect(t, dial[kind](t), kind+"-sub", "")
			// Publish from another transport, so routing crosses listeners.
			pub, _ := lsConnect(t, dial["tcp"](t), kind+"-pub", "")
			lsRoundTrip(t, sub, got, pub, "via/"+kind)
		})
	}
}

func mustDial(t *testing.T, network, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout(network, addr, testkit.Scale(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func dialWS(t *testing.T, url string, tcfg *tls.Config) net.Conn {
	t.Helper()
	d := websocket.Dialer{Subprotocols: []string{"mqtt"}, TLSClientConfig: tcfg, HandshakeTimeout: 5 * time.Second}
	ws, resp, err := d.Dial(url, nil)
	if err != nil {
		t.Fatalf("websocket dial %s: %v", url, err)
	}
	if p := resp.Header.Get("Sec-Websocket-Protocol"); p != "mqtt" {
		t.Errorf("subprotocol = %q, want mqtt [MQTT-6.0.0-3]", p)
	}
	return &wsNetConn{Conn: ws.UnderlyingConn(), ws: ws}
}

// TestClientCertificateAuth: a listener with client_ca admits only clients
// with a certificate it signed, and takes the certificate's common name as
// the user name, which the ACL then sees.
func TestClientCertificateAuth(t *testing.T) {
	pki := certs.New(t, "sensor-7")
	tb := startBroker(t, func(o *Options) {
		o.AllowAnonymous = false
		o.ACL = []auth.ACLRule{{User: "*", Topic: "devices/%u/#", Access: "readwrite"}}
		o.Listeners = []Listener{{Name: "mtls", Type: ListenerTLS, Address: "127.0.0.1:0",
			TLS: TLS{Cert: pki.ServerCert, Key: pki.ServerKey, ClientCA: pki.CAFile}}}
	})
	addr := tb.Broker.Addr("mtls").String()

	// Without a certificate the handshake fails.
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pki.Pool, ServerName: "127.0.0.1"})
	if err == nil {
		// TLS 1.3 reports the refusal on the first read.
		_ = c.SetDeadline(time.Now().Add(testkit.Scale(5 * time.Second)))
		_, err = c.Write([]byte{0x10, 0})
		if err == nil {
			_, err = c.Read(make([]byte, 1))
		}
		c.Close()
	}
	if err == nil {
		t.Fatal("a client without a certificate got through")
	}

	withCert := func() net.Conn {
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pki.Pool, ServerName: "127.0.0.1", Certificates: []tls.Certificate{pki.Client}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	sub, got := lsConnect(t, withCert(), "cert-sub", "")
	pub, _ := lsConnect(t, withCert(), "cert-pub", "")
	// The ACL allows devices/sensor-7/# only because the certificate's
	// common name is the user name.
	lsRoundTrip(t, sub, got, pub, "devices/sensor-7/temp")

	ctx, cancel := context.WithTimeout(context.Background(), testkit.Scale(5*time.Second))
	defer cancel()
	sa, err := sub.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "devices/other/#", QoS: 1}}})
	if err == nil && (len(sa.Reasons) != 1 || sa.Reasons[0] != rcNotAuthorized) {
		t.Fatalf("subscribe outside the ACL: reasons %v, want [0x87]", sa.Reasons)
	}
}

func TestListenerBindErrorNamesListener(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	b, err := New(Options{Config: DefaultConfig(), Listeners: []Listener{
		{Name: "free", Type: ListenerTCP, Address: "127.0.0.1:0"},
		{Name: "busy", Type: ListenerWS, Address: l.Addr().String()},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = b.Start()
	if err == nil || !strings.Contains(err.Error(), `listener "busy"`) {
		t.Fatalf("Start = %v, want an error naming listener \"busy\"", err)
	}
	_ = b.Shutdown(context.Background())
}

func TestListenerBadCertificateFile(t *testing.T) {
	b, err := New(Options{Config: DefaultConfig(), Listeners: []Listener{
		{Name: "secure", Type: ListenerTLS, Address: "127.0.0.1:0", TLS: TLS{Cert: "/nonexistent/cert.pem", Key: "/nonexistent/key.pem"}},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = b.Start()
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/cert.pem") {
		t.Fatalf("Start = %v, want an error naming the certificate file", err)
	}
}
