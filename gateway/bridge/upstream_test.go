package bridge

// Test helpers for everything that talks to an upstream broker: a real
// Mosquitto started per test, a TCP proxy that can go silent, and Paho
// clients (MQTT 5 and 3.1.1) to watch the upstream and publish into it.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// upWait bounds every wait on the upstream in tests: far above what any
// step takes on an idle machine, so that a loaded 2-core CI machine does
// not fail a correct run.
const upWait = 20 * time.Second

// waitFor polls cond until it holds, failing the test after upWait.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(upWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, upWait)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// MosquittoConfig selects what a test's Mosquitto runs with.
type MosquittoConfig struct {
	DenyAnonymous      bool              // allow_anonymous false (it is true otherwise)
	Users              map[string]string // user name → password, in a password file made with mosquitto_passwd
	TLS                bool              // a second listener with TLS, on certificates made for the test
	RequireCertificate bool              // the TLS listener asks for a client certificate from the test CA
	MaxInflight        int               // max_inflight_messages, which Mosquitto sends as Receive Maximum; 0: its default (20)
	Persistence        bool              // persistence true, in the test's directory
	Listener           []string          // extra lines for every listener (max_qos 1, ...)
	Global             []string          // extra global lines (max_packet_size 2000, retain_available false, ...)
}

// Mosquitto is one broker process for a test.
type Mosquitto struct {
	t       testing.TB
	bin     string
	dir     string
	conf    string
	port    int
	tlsPort int
	certs   *testCerts

	log string // the file its output (log_dest stderr) goes to, over restarts

	mu   sync.Mutex
	cmd  *exec.Cmd
	exit chan struct{} // closed when cmd has exited
}

// mosquittoBin finds the broker, failing the test when it is missing: the
// upstream tests are only meaningful against the real thing.
func mosquittoBin(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("mosquitto"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatal("mosquitto is not installed; these tests need the real broker (Debian package mosquitto): `make test` installs it")
	return ""
}

// startMosquitto writes a configuration in t.TempDir(), starts Mosquitto
// on free 127.0.0.1 ports, waits until they accept, and stops it when the
// test ends. On failure the test log gets the broker's log.
func startMosquitto(t testing.TB, cfg MosquittoConfig) *Mosquitto {
	t.Helper()
	m := &Mosquitto{t: t, bin: mosquittoBin(t), dir: t.TempDir()}
	m.log = filepath.Join(m.dir, "mosquitto.log")
	m.port = freePort(t)
	if cfg.TLS {
		m.tlsPort = freePort(t)
		m.certs = makeCerts(t, m.dir)
	}
	var conf strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&conf, format+"\n", args...) }
	// As root Mosquitto would switch to the mosquitto user, which cannot
	// read the test's directory; naming the current user keeps it as is.
	if u, err := user.Current(); err == nil {
		line("user %s", u.Username)
	}
	line("log_dest stderr")
	line("log_type all")
	line("allow_anonymous %t", !cfg.DenyAnonymous)
	if cfg.MaxInflight > 0 {
		line("max_inflight_messages %d", cfg.MaxInflight)
	}
	if cfg.Persistence {
		line("persistence true")
		line("persistence_location %s/", m.dir)
		line("autosave_interval 1")
	} else {
		line("persistence false")
	}
	if cfg.Users != nil {
		line("password_file %s", m.passwordFile(cfg.Users))
	}
	for _, l := range cfg.Global {
		line("%s", l)
	}
	line("listener %d 127.0.0.1", m.port)
	for _, l := range cfg.Listener {
		line("%s", l)
	}
	if cfg.TLS {
		line("listener %d 127.0.0.1", m.tlsPort)
		line("cafile %s", m.certs.caFile)
		line("certfile %s", m.certs.serverCert)
		line("keyfile %s", m.certs.serverKey)
		line("require_certificate %t", cfg.RequireCertificate)
		for _, l := range cfg.Listener {
			line("%s", l)
		}
	}
	m.conf = filepath.Join(m.dir, "mosquitto.conf")
	if err := os.WriteFile(m.conf, []byte(conf.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Stop()
		if t.Failed() {
			t.Logf("mosquitto configuration:\n%s\nmosquitto log:\n%s", conf.String(), m.logText())
		}
	})
	m.Start()
	return m
}

// passwordFile makes a Mosquitto password file with mosquitto_passwd,
// skipping the test when the tool is missing.
func (m *Mosquitto) passwordFile(users map[string]string) string {
	m.t.Helper()
	tool, err := exec.LookPath("mosquitto_passwd")
	if err != nil {
		m.t.Skip("mosquitto_passwd is not installed (Debian package mosquitto): cannot make a password file")
	}
	path := filepath.Join(m.dir, "passwd")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		m.t.Fatal(err)
	}
	for name, pass := range users {
		if out, err := exec.Command(tool, "-b", path, name, pass).CombinedOutput(); err != nil {
			m.t.Fatalf("mosquitto_passwd -b %s %s: %v\n%s", path, name, err, out)
		}
	}
	return path
}

// Addr returns the plain listener's host:port.
func (m *Mosquitto) Addr() string { return fmt.Sprintf("127.0.0.1:%d", m.port) }

// TLSAddr returns the TLS listener's host:port.
func (m *Mosquitto) TLSAddr() string {
	if m.tlsPort == 0 {
		m.t.Fatal("Mosquitto started without TLS")
	}
	return fmt.Sprintf("127.0.0.1:%d", m.tlsPort)
}

// CAFile returns the PEM file of the test CA.
func (m *Mosquitto) CAFile() string { return m.certs.caFile }

// ClientTLS returns a client configuration trusting the test CA as a file
// names it, with serverName, and with the test client certificate when
// withCert.
func (m *Mosquitto) ClientTLS(serverName string, withCert bool) *tls.Config {
	m.t.Helper()
	pem, err := os.ReadFile(m.certs.caFile)
	if err != nil {
		m.t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		m.t.Fatalf("no certificate in %s", m.certs.caFile)
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}
	if withCert {
		cert, err := tls.LoadX509KeyPair(m.certs.clientCert, m.certs.clientKey)
		if err != nil {
			m.t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg
}

// Start starts Mosquitto (again, after Stop: same ports, same
// persistence) and waits until its listeners accept.
func (m *Mosquitto) Start() {
	m.t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		m.t.Fatal("mosquitto is already running")
	}
	out, err := os.OpenFile(m.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		m.t.Fatal(err)
	}
	defer out.Close() // the child has its own descriptor
	fmt.Fprintf(out, "--- start\n")
	cmd := exec.Command(m.bin, "-c", m.conf)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		m.t.Fatalf("start %s: %v", m.bin, err)
	}
	exit := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exit)
	}()
	m.cmd, m.exit = cmd, exit
	addrs := []string{m.Addr()}
	if m.tlsPort != 0 {
		addrs = append(addrs, m.TLSAddr())
	}
	deadline := time.Now().Add(upWait)
	for _, a := range addrs {
		for {
			c, err := net.DialTimeout("tcp", a, time.Second)
			if err == nil {
				c.Close()
				break
			}
			select {
			case <-exit:
				m.t.Fatalf("mosquitto exited at start (%v); log:\n%s", cmd.ProcessState, m.logText())
			case <-time.After(20 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				m.t.Fatalf("mosquitto is not accepting on %s after %v: %v", a, upWait, err)
			}
		}
	}
}

// Stop ends Mosquitto by its pid (SIGTERM, which saves persistence; SIGKILL
// if it lingers) and waits for it. It is a no-op when it is not running.
func (m *Mosquitto) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exit:
	case <-time.After(upWait):
		_ = m.cmd.Process.Kill()
		<-m.exit
	}
	if f, err := os.OpenFile(m.log, os.O_WRONLY|os.O_APPEND, 0); err == nil {
		fmt.Fprintf(f, "--- stopped: %v\n", m.cmd.ProcessState)
		f.Close()
	}
	m.cmd, m.exit = nil, nil
}

// logText returns what Mosquitto has logged so far.
func (m *Mosquitto) logText() string {
	b, err := os.ReadFile(m.log)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// freePort returns a 127.0.0.1 TCP port nothing listens on.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// testCerts are the PEM files of a CA, a server certificate for 127.0.0.1
// and localhost, and a client certificate, all made for one test.
type testCerts struct {
	caFile                string
	serverCert, serverKey string
	clientCert, clientKey string
}

func makeCerts(t testing.TB, dir string) *testCerts {
	t.Helper()
	now := time.Now()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	serial := int64(1)
	template := func(cn string) *x509.Certificate {
		serial++
		return &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: cn, Organization: []string{"fieldgate test"}},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
		}
	}
	write := func(name, kind string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	writeKey := func(name string, k *ecdsa.PrivateKey) string {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return write(name, "PRIVATE KEY", der)
	}

	caKey := newKey()
	caTmpl := template("fieldgate test CA")
	caTmpl.IsCA = true
	caTmpl.BasicConstraintsValid = true
	caTmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(cn string, usage x509.ExtKeyUsage, edit func(*x509.Certificate)) ([]byte, *ecdsa.PrivateKey) {
		k := newKey()
		tmpl := template(cn)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{usage}
		if edit != nil {
			edit(tmpl)
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, k
	}
	srvDER, srvKey := leaf("localhost", x509.ExtKeyUsageServerAuth, func(c *x509.Certificate) {
		c.DNSNames = []string{"localhost"}
		c.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	})
	cliDER, cliKey := leaf("gateway-1", x509.ExtKeyUsageClientAuth, nil)
	return &testCerts{
		caFile:     write("ca.pem", "CERTIFICATE", caDER),
		serverCert: write("server.pem", "CERTIFICATE", srvDER),
		serverKey:  writeKey("server.key", srvKey),
		clientCert: write("client.pem", "CERTIFICATE", cliDER),
		clientKey:  writeKey("client.key", cliKey),
	}
}

// Proxy is a TCP proxy between a client and target. Freeze makes it stop
// forwarding in both directions without closing anything: to both ends
// the link goes silent, as when a mobile link or a NAT drops it.
type Proxy struct {
	t      testing.TB
	ln     net.Listener
	target string

	mu      sync.Mutex
	cond    sync.Cond
	frozen  bool
	upLimit int64 // client→server bytes forwarded before holding the rest; -1: no limit
	upSent  int64 // client→server bytes forwarded
	held    int64 // bytes read but not forwarded
	closed  bool
	conns   []net.Conn
	wg      sync.WaitGroup
}

// newProxy listens on a free 127.0.0.1 port and forwards every connection
// to target until Close, which the test's cleanup calls.
func newProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{t: t, ln: ln, target: target, upLimit: -1}
	p.cond.L = &p.mu
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Freeze stops forwarding, in both directions, on every connection.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	p.frozen = true
	p.mu.Unlock()
}

// Thaw forwards again, what was held first, and lifts HoldUpAfter.
func (p *Proxy) Thaw() {
	p.mu.Lock()
	p.frozen = false
	p.upLimit = -1
	p.cond.Broadcast()
	p.mu.Unlock()
}

// HoldUpAfter forwards client→server bytes only until UpSent reaches
// total, and holds the rest until Thaw; the other direction flows on.
func (p *Proxy) HoldUpAfter(total int64) {
	p.mu.Lock()
	p.upLimit = total
	p.cond.Broadcast()
	p.mu.Unlock()
}

// UpSent returns the client→server bytes forwarded so far, over all
// connections.
func (p *Proxy) UpSent() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.upSent
}

// Held returns the bytes read from either side and not yet forwarded.
func (p *Proxy) Held() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// Close closes the listener and every connection, and waits for the
// proxy's goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.DialTimeout("tcp", p.target, upWait)
		if err != nil {
			down.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			down.Close()
			up.Close()
			return
		}
		p.conns = append(p.conns, down, up)
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pump(up, down, true)
		go p.pump(down, up, false)
	}
}

// pump copies src to dst, waiting at the gate before every write. An end
// of either side closes both, once the gate is open: a frozen proxy passes
// on no close either.
func (p *Proxy) pump(dst, src net.Conn, upward bool) {
	defer p.wg.Done()
	defer func() {
		dst.Close()
		src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.hold(n)
		for off := 0; off < n; {
			k, ok := p.gate(upward, n-off)
			if !ok {
				return
			}
			if _, err := dst.Write(buf[off : off+k]); err != nil {
				return
			}
			off += k
			p.hold(-k)
		}
		if err != nil {
			p.gate(upward, 0)
			return
		}
	}
}

func (p *Proxy) hold(n int) {
	p.mu.Lock()
	p.held += int64(n)
	p.mu.Unlock()
}

// gate waits until bytes may go on in the given direction and returns how
// many of n may; false once the proxy is closed.
func (p *Proxy) gate(upward bool, n int) (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if p.closed {
			return 0, false
		}
		if p.frozen {
			p.cond.Wait()
			continue
		}
		if upward && p.upLimit >= 0 && n > 0 {
			room := p.upLimit - p.upSent
			if room <= 0 {
				p.cond.Wait()
				continue
			}
			n = int(min(int64(n), room))
		}
		if upward {
			p.upSent += int64(n)
		}
		return n, true
	}
}

// v5Watcher is a Paho MQTT 5 client that watches the upstream: every
// PUBLISH it gets arrives on msgs.
type v5Watcher struct {
	*paho.Client
	msgs chan *paho.Publish
}

// watchV5 connects a Paho MQTT 5 client to addr and subscribes it to
// filter at qos. It disconnects when the test ends.
func watchV5(t testing.TB, addr, id, filter string, qos byte) *v5Watcher {
	t.Helper()
	w := &v5Watcher{msgs: make(chan *paho.Publish, 4096)}
	w.Client = pahoV5(t, addr, id, func(pr paho.PublishReceived) (bool, error) {
		w.msgs <- pr.Packet
		return true, nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), upWait)
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

// next returns the next message the watcher gets, failing the test after
// upWait.
func (w *v5Watcher) next(t testing.TB) *paho.Publish {
	t.Helper()
	select {
	case m := <-w.msgs:
		return m
	case <-time.After(upWait):
		t.Fatalf("paho watcher: no message within %v", upWait)
		return nil
	}
}

// pahoV5 connects a Paho MQTT 5 client to addr, with onPublish for what
// it receives (nil: none expected).
func pahoV5(t testing.TB, addr, id string, onPublish func(paho.PublishReceived) (bool, error)) *paho.Client {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, upWait)
	if err != nil {
		t.Fatalf("paho dial %s: %v", addr, err)
	}
	cfg := paho.ClientConfig{Conn: nc, PacketTimeout: upWait}
	if onPublish != nil {
		cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){onPublish}
	}
	c := paho.NewClient(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), upWait)
	defer cancel()
	if _, err := c.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}); err != nil {
		nc.Close()
		t.Fatalf("paho connect %q to %s: %v", id, addr, err)
	}
	t.Cleanup(func() { _ = c.Disconnect(&paho.Disconnect{}) })
	return c
}

// pahoPublish publishes one message with a Paho MQTT 5 client and waits
// for its acknowledgement.
func pahoPublish(t testing.TB, c *paho.Client, topic string, qos byte, payload []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), upWait)
	defer cancel()
	if _, err := c.Publish(ctx, &paho.Publish{Topic: topic, QoS: qos, Payload: payload}); err != nil {
		t.Fatalf("paho publish to %q: %v", topic, err)
	}
}

// v311Watcher is a Paho MQTT 3.1.1 client that watches the upstream.
type v311Watcher struct {
	mqtt.Client
	msgs chan mqtt.Message
}

// watchV311 connects a Paho MQTT 3.1.1 client to addr and subscribes it
// to filter at qos. It disconnects when the test ends.
func watchV311(t testing.TB, addr, id, filter string, qos byte) *v311Watcher {
	t.Helper()
	w := &v311Watcher{msgs: make(chan mqtt.Message, 4096)}
	o := mqtt.NewClientOptions().
		AddBroker("tcp://" + addr).
		SetClientID(id).
		SetProtocolVersion(4).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectTimeout(upWait).
		SetWriteTimeout(upWait).
		SetOrderMatters(true).
		SetDefaultPublishHandler(func(_ mqtt.Client, m mqtt.Message) { w.msgs <- m })
	w.Client = mqtt.NewClient(o)
	if tok := w.Connect(); !tok.WaitTimeout(upWait) || tok.Error() != nil {
		t.Fatalf("paho 3.1.1 connect %q to %s: %v", id, addr, tok.Error())
	}
	t.Cleanup(func() { w.Disconnect(100) })
	if tok := w.Subscribe(filter, qos, nil); !tok.WaitTimeout(upWait) || tok.Error() != nil {
		t.Fatalf("paho 3.1.1 subscribe %q: %v", filter, tok.Error())
	}
	return w
}

// next returns the next message the watcher gets, failing the test after
// upWait.
func (w *v311Watcher) next(t testing.TB) mqtt.Message {
	t.Helper()
	select {
	case m := <-w.msgs:
		return m
	case <-time.After(upWait):
		t.Fatalf("paho 3.1.1 watcher: no message within %v", upWait)
		return nil
	}
}

// TestMosquittoRestart checks the helper itself: Stop ends the broker by
// its pid, and Start brings it back on the same port with the same
// persistence, so a session survives the outage.
func TestMosquittoRestart(t *testing.T) {
	m := startMosquitto(t, MosquittoConfig{Persistence: true})
	addr := m.Addr()
	c, err := Dial(context.Background(), ClientOptions{Address: addr, ClientID: "restart", SessionExpiry: time.Hour, ConnectTimeout: upWait, AckTimeout: upWait})
	if err != nil {
		t.Fatal(err)
	}
	if c.Info().SessionPresent {
		t.Fatal("session present on the first connection")
	}
	c.Close()
	m.Stop()
	if nc, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		nc.Close()
		t.Fatalf("%s still accepts after Stop", addr)
	}
	m.Start()
	if m.Addr() != addr {
		t.Fatalf("restarted on %s, want %s", m.Addr(), addr)
	}
	c, err = Dial(context.Background(), ClientOptions{Address: addr, ClientID: "restart", SessionExpiry: time.Hour, ConnectTimeout: upWait, AckTimeout: upWait})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !c.Info().SessionPresent {
		t.Fatal("no session after the restart: persistence was lost")
	}
}

// TestProxyFreeze checks the proxy: it forwards, goes silent on Freeze
// without closing either side, and forwards what it held on Thaw.
func TestProxyFreeze(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	p := newProxy(t, echo.Addr().String())
	c, err := net.DialTimeout("tcp", p.Addr(), upWait)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip := func(msg string) error {
		if _, err := c.Write([]byte(msg)); err != nil {
			return err
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil {
			return err
		}
		if string(got) != msg {
			return fmt.Errorf("echo %q, want %q", got, msg)
		}
		return nil
	}
	_ = c.SetDeadline(time.Now().Add(upWait))
	if err := roundTrip("before"); err != nil {
		t.Fatal(err)
	}
	p.Freeze()
	if _, err := c.Write([]byte("during")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if n, err := c.Read(make([]byte, 16)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("frozen proxy: read %d bytes, err %v; want silence", n, err)
	}
	if p.Held() == 0 {
		t.Fatal("frozen proxy holds nothing of what was written")
	}
	p.Thaw()
	_ = c.SetDeadline(time.Now().Add(upWait))
	got := make([]byte, len("during"))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "during" {
		t.Fatalf("after thaw: %q, %v; want the held bytes", got, err)
	}
	if err := roundTrip("after"); err != nil {
		t.Fatal(err)
	}
	if p.UpSent() != int64(len("before")+len("during")+len("after")) {
		t.Fatalf("UpSent %d, want %d", p.UpSent(), len("before")+len("during")+len("after"))
	}
}
