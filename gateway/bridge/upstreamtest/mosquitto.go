package upstreamtest

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
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
)

// Wait bounds every wait on the upstream in tests: far above what any
// step takes on an idle machine, so that a loaded 2-core CI machine does
// not fail a correct run.
const Wait = 20 * time.Second

// WaitFor polls cond until it holds, failing the test after Wait.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, Wait)
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

// StartMosquitto writes a configuration in t.TempDir(), starts Mosquitto
// on free 127.0.0.1 ports, waits until they accept, and stops it when the
// test ends. On failure the test log gets the broker's log.
func StartMosquitto(t testing.TB, cfg MosquittoConfig) *Mosquitto {
	t.Helper()
	m := &Mosquitto{t: t, bin: mosquittoBin(t), dir: t.TempDir()}
	m.log = filepath.Join(m.dir, "mosquitto.log")
	m.port = FreePort(t)
	if cfg.TLS {
		m.tlsPort = FreePort(t)
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

// ClientCertFiles returns the PEM files of the test client certificate
// and of its key.
func (m *Mosquitto) ClientCertFiles() (cert, key string) {
	return m.certs.clientCert, m.certs.clientKey
}

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
	deadline := time.Now().Add(Wait)
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
				m.t.Fatalf("mosquitto is not accepting on %s after %v: %v", a, Wait, err)
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
	case <-time.After(Wait):
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

// FreePort returns a 127.0.0.1 TCP port nothing listens on.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
