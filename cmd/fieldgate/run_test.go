package main

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// notifySocket is a real unixgram socket standing in for systemd's.
type notifySocket struct {
	conn *net.UnixConn
	path string
	mu   sync.Mutex
	msgs []string
}

func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	n := &notifySocket{conn: conn, path: path}
	go func() {
		buf := make([]byte, 4096)
		for {
			k, err := conn.Read(buf)
			if err != nil {
				return
			}
			n.mu.Lock()
			n.msgs = append(n.msgs, string(buf[:k]))
			n.mu.Unlock()
		}
	}()
	t.Cleanup(func() { conn.Close() })
	return n
}

// waitFor waits until a datagram containing want arrives after the first
// skip ones, and returns its index.
func (n *notifySocket) waitFor(t *testing.T, want string, skip int) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		n.mu.Lock()
		for i := skip; i < len(n.msgs); i++ {
			if strings.Contains(n.msgs[i], want) {
				n.mu.Unlock()
				return i
			}
		}
		n.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	t.Fatalf("no %q from the gateway; got %q", want, n.msgs)
	return 0
}

// TestRunUnderSystemd runs the binary as systemd would: READY once it
// listens, STATUS, RELOADING and READY around a SIGHUP with a good file, a
// refused reload with a bad one (the gateway keeps running), STOPPING on
// SIGTERM.
func TestRunUnderSystemd(t *testing.T) {
	ns := listenNotify(t)
	dir := t.TempDir()
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	cfgPath := filepath.Join(dir, "fieldgate.yaml")
	good := "storage: {path: " + filepath.Join(dir, "state.db") + "}\nbroker: {allow_anonymous: true}\nlisteners: [{name: default, type: tcp, address: \"" + addr + "\"}]\nops: {address: \"\"}\nsensors: []\noutputs: []\n"
	if err := os.WriteFile(cfgPath, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	var outMu sync.Mutex
	cmd := exec.Command(binary, "run", "-config", cfgPath)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+ns.path)
	cmd.Stdout, cmd.Stderr = lockedWriter{&out, &outMu}, lockedWriter{&out, &outMu}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			outMu.Lock()
			t.Logf("gateway output:\n%s", out.String())
			outMu.Unlock()
		}
	}()

	ready := ns.waitFor(t, "READY=1", 0)
	if c, err := net.Dial("tcp", addr); err != nil {
		t.Errorf("READY=1 came before the listener accepted: %v", err)
	} else {
		c.Close()
	}
	ns.waitFor(t, "STATUS=", 0)

	// A good reload: the log level goes to debug.
	if err := os.WriteFile(cfgPath, []byte("log: {level: debug}\n"+good), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Signal(syscall.SIGHUP)
	r := ns.waitFor(t, "RELOADING=1", ready+1)
	ns.waitFor(t, "READY=1", r+1)

	// A bad file is refused; the gateway goes on.
	if err := os.WriteFile(cfgPath, []byte("log: {level: loud}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(10 * time.Second)
	for {
		outMu.Lock()
		refused := strings.Contains(out.String(), "reload refused") && strings.Contains(out.String(), "log.level")
		outMu.Unlock()
		if refused {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no log line refusing the bad configuration, naming log.level")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if c, err := net.Dial("tcp", addr); err != nil {
		t.Errorf("the gateway stopped serving after a refused reload: %v", err)
	} else {
		c.Close()
	}

	_ = cmd.Process.Signal(syscall.SIGTERM)
	ns.waitFor(t, "STOPPING=1", 0)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the gateway did not exit after SIGTERM")
	}
}

type lockedWriter struct {
	b  *bytes.Buffer
	mu *sync.Mutex
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}
