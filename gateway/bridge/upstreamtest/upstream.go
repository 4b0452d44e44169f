// Package upstreamtest runs Debian's mosquitto as the cloud broker of
// tests that need a real upstream: persistence on, an unbounded queue for
// offline subscribers, and Stop and Start to make an outage. It is used
// only by tests; the firmware never imports it.
package upstreamtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
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
	u := &Upstream{t: t, addr: addr, bin: bin, conf: filepath.Join(dir, "mosquitto.conf")}
	_, port, _ := net.SplitHostPort(addr)
	who := ""
	if cur, err := user.Current(); err == nil {
		// As root mosquitto would switch to a user that cannot read dir.
		who = "user " + cur.Username + "\n"
	}
	// max_queued_messages 0: an offline subscriber's queue is unbounded,
	// so the upstream never drops what the bridge delivered to it.
	conf := fmt.Sprintf("%slistener %s 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location %s/\nmax_queued_messages 0\nlog_dest none\n", who, port, dir)
	if err := os.WriteFile(u.conf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	u.Start()
	t.Cleanup(u.Stop)
	return u
}

// Addr is mosquitto's host:port.
func (u *Upstream) Addr() string { return u.addr }

// Start runs mosquitto again after Stop, on the same port and state.
func (u *Upstream) Start() {
	u.t.Helper()
	if u.done != nil {
		return
	}
	cmd := exec.Command(u.bin, "-c", u.conf)
	if err := cmd.Start(); err != nil {
		u.t.Fatalf("starting mosquitto: %v", err)
	}
	u.cmd, u.done = cmd, make(chan struct{})
	done := u.done
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	deadline := time.Now().Add(waitReady)
	for {
		if c, err := net.Dial("tcp", u.addr); err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			u.t.Fatalf("mosquitto not listening on %s after %s", u.addr, waitReady)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop ends mosquitto cleanly; it saves its persistence file on the way.
func (u *Upstream) Stop() {
	if u.done == nil {
		return
	}
	_ = u.cmd.Process.Signal(os.Interrupt)
	select {
	case <-u.done:
	case <-time.After(15 * time.Second):
		_ = u.cmd.Process.Kill()
		<-u.done
	}
	u.done = nil
}
