// Package upstreamtest runs Debian's mosquitto as the cloud broker of
// tests that need a real upstream: persistence on, an unbounded queue for
// offline subscribers, and Stop and Start to make an outage. Terminate,
// Wipe and Aside make the other faults a cloud broker has: a stop by
// SIGTERM, a restart that has lost every session, and work on its stored
// state while its clients still find it down.
//
// StartMosquitto runs one configured for a test instead (TLS, users, limits,
// extra listener lines); Proxy sits between a client and it and can go
// silent; WatchV5, WatchV311 and PahoV5 are Paho clients that watch the
// upstream and publish into it. It is used only by tests; the firmware
// never imports it.
package upstreamtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// waitReady bounds mosquitto's start.
const waitReady = 30 * time.Second

// Upstream is one mosquitto process on a free loopback port.
type Upstream struct {
	t    testing.TB
	addr string
	bin  string
	dir  string // the persistence location, which holds the configuration too
	who  string // the configuration's user line, empty unless needed
	conf string
	cmd  *exec.Cmd
	done chan struct{}
}

// Start runs mosquitto for the test and stops it when the test ends. A
// missing mosquitto fails the test: `make test` installs it.
func Start(t testing.TB) *Upstream {
	t.Helper()
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		if _, statErr := os.Stat("/usr/sbin/mosquitto"); statErr != nil {
			t.Fatal("mosquitto is not installed: `make test` installs it (apt-get install mosquitto)")
		}
		bin = "/usr/sbin/mosquitto"
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	u := &Upstream{t: t, addr: addr, bin: bin, dir: dir, conf: filepath.Join(dir, "mosquitto.conf")}
	if cur, err := user.Current(); err == nil {
		// As root mosquitto would switch to a user that cannot read dir.
		u.who = "user " + cur.Username + "\n"
	}
	u.writeConf(u.conf, addr)
	u.Start()
	t.Cleanup(u.Stop)
	return u
}

// writeConf writes a configuration that listens on addr and keeps its
// state in u.dir.
func (u *Upstream) writeConf(path, addr string) {
	u.t.Helper()
	_, port, _ := net.SplitHostPort(addr)
	// max_queued_messages 0: an offline subscriber's queue is unbounded,
	// so the upstream never drops what the bridge delivered to it.
	conf := fmt.Sprintf("%slistener %s 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location %s/\nmax_queued_messages 0\nlog_dest none\n", u.who, port, u.dir)
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		u.t.Fatal(err)
	}
}

// Addr is mosquitto's host:port.
func (u *Upstream) Addr() string { return u.addr }

// Start runs mosquitto again after Stop, on the same port and state.
func (u *Upstream) Start() {
	u.t.Helper()
	if u.done != nil {
		return
	}
	u.cmd, u.done = u.run(u.conf, u.addr)
}

// run starts mosquitto with the configuration at conf and returns once it
// listens on addr; done is closed when the process has been reaped.
func (u *Upstream) run(conf, addr string) (cmd *exec.Cmd, done chan struct{}) {
	u.t.Helper()
	cmd = exec.Command(u.bin, "-c", conf)
	if err := cmd.Start(); err != nil {
		u.t.Fatalf("starting mosquitto: %v", err)
	}
	done = make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	deadline := time.Now().Add(waitReady)
	for {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return cmd, done
		}
		if time.Now().After(deadline) {
			end(cmd, done, os.Kill)
			u.t.Fatalf("mosquitto not listening on %s after %s", addr, waitReady)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop ends mosquitto cleanly; it saves its persistence file on the way.
func (u *Upstream) Stop() { u.stop(os.Interrupt) }

// Terminate ends mosquitto with SIGTERM, as an init system stops a
// service: like Stop, it closes its clients' connections and saves its
// persistence file before it exits.
func (u *Upstream) Terminate() { u.stop(syscall.SIGTERM) }

func (u *Upstream) stop(sig os.Signal) {
	if u.done == nil {
		return
	}
	end(u.cmd, u.done, sig)
	u.done = nil
}

// end signals a mosquitto process and waits until it is reaped, killing
// it if it takes longer than 15 s.
func end(cmd *exec.Cmd, done <-chan struct{}, sig os.Signal) {
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Wipe deletes the stopped upstream's persistence file, so that the next
// Start (or Aside) begins with no session, subscription or queued
// message: a cloud broker rebuilt or failed over without its state. A
// client that resumes its session then gets Session Present 0.
func (u *Upstream) Wipe() {
	u.t.Helper()
	if u.done != nil {
		u.t.Fatal("upstreamtest: Wipe on a running upstream; Stop it first")
	}
	err := os.Remove(filepath.Join(u.dir, "mosquitto.db"))
	if err != nil && !os.IsNotExist(err) {
		u.t.Fatalf("upstreamtest: wiping the persistence file: %v", err)
	}
}

// Aside runs mosquitto on the stopped upstream's state at another free
// loopback port, calls fn with that address, then stops it, which saves
// the state for the next Start. Clients that know only Addr still find the
// upstream down meanwhile: a test reads what it holds (drains a
// subscriber's queue before a Wipe) or prepares it (creates a subscriber's
// session after one) without the client under test seeing any of it.
// mosquitto saves only the sessions whose last connection did not ask for
// a clean start: a session made in fn must be resumed once to be kept.
func (u *Upstream) Aside(fn func(addr string)) {
	u.t.Helper()
	if u.done != nil {
		u.t.Fatal("upstreamtest: Aside on a running upstream; Stop it first")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		u.t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	conf := filepath.Join(u.dir, "aside.conf")
	u.writeConf(conf, addr)
	cmd, done := u.run(conf, addr)
	// fn may end the test's goroutine (t.Fatal): the state is saved still.
	defer end(cmd, done, syscall.SIGTERM)
	fn(addr)
}
