// Package mosquitto runs Debian's mosquitto as the real MQTT broker a test
// talks to: the bridge's upstream, a cloud broker the whole gateway
// forwards to. Start writes a configuration in the test's directory,
// starts mosquitto on free loopback ports, waits until they accept, and
// stops it when the test ends; a failed test's log gets the configuration
// and what mosquitto logged. Stop and Start make an outage on the same
// ports and state; Wipe and Aside make the other faults of a cloud broker:
// a restart that has lost every session, and work on its stored state
// while its clients still find it down.
//
// A missing mosquitto fails the test rather than skipping it: the tests
// that use it mean something only against the real broker, and `make
// test` installs it.
package mosquitto

import (
	"crypto/tls"
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

	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/internal/testkit/certs"
)

// wait bounds mosquitto's start and stop, before the time scale: far
// above the milliseconds either takes, so that only a broker that hangs
// fails a test.
const wait = 20 * time.Second

// Config selects what a test's mosquitto runs with.
type Config struct {
	DenyAnonymous      bool              // allow_anonymous false (it is true otherwise)
	Users              map[string]string // user name → password, in a password file made with mosquitto_passwd
	TLS                bool              // a second listener with TLS, on certificates made for the test
	RequireCertificate bool              // the TLS listener asks for a client certificate from the test CA
	MaxInflight        int               // max_inflight_messages, which mosquitto sends as Receive Maximum; 0: its default (20)
	Persistence        bool              // persistence true, in the test's directory, saved whenever mosquitto stops
	AutosaveEvery      int               // with Persistence: autosave_interval in seconds; 0: mosquitto's default (every 30 minutes)
	UnboundedQueues    bool              // max_queued_messages 0: an offline subscriber's queue never drops
	Quiet              bool              // log_dest none, for traffic whose every packet would otherwise be logged
	Listener           []string          // extra lines for every listener (max_qos 1, ...)
	Global             []string          // extra global lines (max_packet_size 2000, retain_available false, ...)
}

// Cloud is the configuration of a cloud broker the whole gateway bridges
// to: it keeps its sessions over restarts, never drops what it queued for
// an offline subscriber (so the bridge alone answers for any loss), and
// logs nothing, since those tests drive thousands of messages through it.
func Cloud() Config {
	return Config{Persistence: true, UnboundedQueues: true, Quiet: true}
}

// Broker is one mosquitto for a test.
type Broker struct {
	t       testing.TB
	cfg     Config
	bin     string
	dir     string // the test's directory: configuration, persistence, log
	conf    string
	addr    string
	tlsAddr string     // empty without TLS
	pki     *certs.PKI // nil without TLS
	who     string     // the current user's name, for mosquitto's user line
	log     string     // the file its output goes to, over restarts

	mu   sync.Mutex
	cmd  *exec.Cmd
	exit chan struct{} // closed when cmd has been reaped
}

// binary finds mosquitto, failing the test when it is missing.
func binary(t testing.TB) string {
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

// Start writes a configuration from cfg in t.TempDir(), starts mosquitto
// on free 127.0.0.1 ports, waits until they accept, and stops it when the
// test ends.
func Start(t testing.TB, cfg Config) *Broker {
	t.Helper()
	m := &Broker{t: t, cfg: cfg, bin: binary(t), dir: t.TempDir()}
	m.log = filepath.Join(m.dir, "mosquitto.log")
	m.addr = testkit.FreeAddr(t)
	if cfg.TLS {
		m.tlsAddr = testkit.FreeAddr(t)
		m.pki = certs.New(t, "gateway-1")
	}
	// As root mosquitto would switch to the mosquitto user, which cannot
	// read the test's directory; naming the current user keeps it as is.
	if u, err := user.Current(); err == nil {
		m.who = u.Username
	}
	var users string
	if cfg.Users != nil {
		users = m.passwordFile(cfg.Users)
	}
	m.conf = filepath.Join(m.dir, "mosquitto.conf")
	conf := m.config(m.addr, m.tlsAddr, users)
	if err := os.WriteFile(m.conf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Stop()
		if t.Failed() {
			t.Logf("mosquitto configuration:\n%s\nmosquitto log:\n%s", conf, m.logText())
		}
	})
	m.Start()
	return m
}

// config returns a configuration that listens on addr (and with TLS on
// tlsAddr) and keeps its state in m.dir; users is the password file, if
// any.
func (m *Broker) config(addr, tlsAddr, users string) string {
	cfg := m.cfg
	var conf strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&conf, format+"\n", args...) }
	if m.who != "" {
		line("user %s", m.who)
	}
	if cfg.Quiet {
		line("log_dest none")
	} else {
		line("log_dest stderr")
		line("log_type all")
	}
	line("allow_anonymous %t", !cfg.DenyAnonymous)
	if cfg.MaxInflight > 0 {
		line("max_inflight_messages %d", cfg.MaxInflight)
	}
	if cfg.Persistence {
		line("persistence true")
		line("persistence_location %s/", m.dir)
		if cfg.AutosaveEvery > 0 {
			line("autosave_interval %d", cfg.AutosaveEvery)
		}
	} else {
		line("persistence false")
	}
	if cfg.UnboundedQueues {
		line("max_queued_messages 0")
	}
	if users != "" {
		line("password_file %s", users)
	}
	for _, l := range cfg.Global {
		line("%s", l)
	}
	line("listener %s 127.0.0.1", port(addr))
	for _, l := range cfg.Listener {
		line("%s", l)
	}
	if tlsAddr != "" {
		line("listener %s 127.0.0.1", port(tlsAddr))
		line("cafile %s", m.pki.CAFile)
		line("certfile %s", m.pki.ServerCert)
		line("keyfile %s", m.pki.ServerKey)
		line("require_certificate %t", cfg.RequireCertificate)
		for _, l := range cfg.Listener {
			line("%s", l)
		}
	}
	return conf.String()
}

// passwordFile makes a mosquitto password file with mosquitto_passwd,
// skipping the test when the tool is missing.
func (m *Broker) passwordFile(users map[string]string) string {
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

// port returns the port of a host:port.
func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// Addr returns the plain listener's host:port.
func (m *Broker) Addr() string { return m.addr }

// TLSAddr returns the TLS listener's host:port.
func (m *Broker) TLSAddr() string {
	if m.tlsAddr == "" {
		m.t.Fatal("mosquitto started without TLS")
	}
	return m.tlsAddr
}

// PKI returns the test CA and certificates of the TLS listener.
func (m *Broker) PKI() *certs.PKI {
	if m.pki == nil {
		m.t.Fatal("mosquitto started without TLS")
	}
	return m.pki
}

// ClientTLS returns a client configuration for the TLS listener: it trusts
// the test CA as a file names it, with serverName, and with the test
// client certificate when withCert.
func (m *Broker) ClientTLS(serverName string, withCert bool) *tls.Config {
	m.t.Helper()
	return m.PKI().ClientTLS(m.t, serverName, withCert)
}

// Start starts mosquitto again after Stop, on the same ports and
// persistence, and waits until its listeners accept.
func (m *Broker) Start() {
	m.t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		m.t.Fatal("mosquitto is already running")
	}
	addrs := []string{m.addr}
	if m.tlsAddr != "" {
		addrs = append(addrs, m.tlsAddr)
	}
	m.cmd, m.exit = m.run("start", m.conf, addrs)
}

// run starts mosquitto with the configuration at conf, its output going to
// the log after a line naming why, and returns once it accepts on every
// address; exit is closed when the process has been reaped.
func (m *Broker) run(why, conf string, addrs []string) (cmd *exec.Cmd, exit chan struct{}) {
	m.t.Helper()
	out, err := os.OpenFile(m.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		m.t.Fatal(err)
	}
	defer out.Close() // the child has its own descriptor
	fmt.Fprintf(out, "--- %s\n", why)
	cmd = exec.Command(m.bin, "-c", conf)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		m.t.Fatalf("start %s: %v", m.bin, err)
	}
	exit = make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exit)
	}()
	limit := testkit.Scale(wait)
	deadline := time.Now().Add(limit)
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
				end(cmd, exit)
				m.t.Fatalf("mosquitto is not accepting on %s after %v: %v", a, limit, err)
			}
		}
	}
	return cmd, exit
}

// Stop ends mosquitto with SIGTERM, as an init system stops a service: it
// closes its clients' connections (with no DISCONNECT) and saves its
// persistence file before it exits. Stop waits until it has; it is a no-op
// when mosquitto is not running.
func (m *Broker) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return
	}
	end(m.cmd, m.exit)
	if f, err := os.OpenFile(m.log, os.O_WRONLY|os.O_APPEND, 0); err == nil {
		fmt.Fprintf(f, "--- stopped: %v\n", m.cmd.ProcessState)
		f.Close()
	}
	m.cmd, m.exit = nil, nil
}

// end sends a mosquitto process SIGTERM and waits until it is reaped,
// killing it if it lingers.
func end(cmd *exec.Cmd, exit <-chan struct{}) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exit:
	case <-time.After(testkit.Scale(wait)):
		_ = cmd.Process.Kill()
		<-exit
	}
}

// stopped fails the test, naming op, unless mosquitto is stopped.
func (m *Broker) stopped(op string) {
	m.t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		m.t.Fatalf("mosquitto: %s on a running broker; Stop it first", op)
	}
}

// Wipe deletes the stopped broker's persistence file, so that the next
// Start (or Aside) begins with no session, subscription or queued
// message: a cloud broker rebuilt or failed over without its state. A
// client that resumes its session then gets Session Present 0.
func (m *Broker) Wipe() {
	m.t.Helper()
	m.stopped("Wipe")
	err := os.Remove(filepath.Join(m.dir, "mosquitto.db"))
	if err != nil && !os.IsNotExist(err) {
		m.t.Fatalf("mosquitto: wiping the persistence file: %v", err)
	}
}

// Aside runs mosquitto on the stopped broker's state at another free
// loopback port, calls fn with that address, then stops it, which saves
// the state for the next Start. Clients that know only Addr still find the
// broker down meanwhile: a test reads what it holds (drains a subscriber's
// queue before a Wipe) or prepares it (creates a subscriber's session
// after one) without the client under test seeing any of it. mosquitto
// saves only the sessions whose last connection did not ask for a clean
// start: a session made in fn must be resumed once to be kept.
func (m *Broker) Aside(fn func(addr string)) {
	m.t.Helper()
	m.stopped("Aside")
	addr := testkit.FreeAddr(m.t)
	var users string
	if m.cfg.Users != nil {
		users = filepath.Join(m.dir, "passwd")
	}
	conf := filepath.Join(m.dir, "aside.conf")
	if err := os.WriteFile(conf, []byte(m.config(addr, "", users)), 0o600); err != nil {
		m.t.Fatal(err)
	}
	cmd, exit := m.run("aside", conf, []string{addr})
	// fn may end the test's goroutine (t.Fatal): the state is saved still.
	defer end(cmd, exit)
	fn(addr)
}

// logText returns what mosquitto has logged so far.
func (m *Broker) logText() string {
	b, err := os.ReadFile(m.log)
	if err != nil {
		return err.Error()
	}
	return string(b)
}
