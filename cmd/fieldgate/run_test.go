package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/internal/testkit/notifysocket"
)

// TestRunUnderSystemd runs the binary as systemd would: READY once it
// listens, STATUS, RELOADING and READY around a SIGHUP with a good file, a
// refused reload with a bad one (the gateway keeps running), STOPPING on
// SIGTERM.
func TestRunUnderSystemd(t *testing.T) {
	ns := notifysocket.Listen(t)
	dir := t.TempDir()
	addr := testkit.FreeAddr(t)
	cfgPath := filepath.Join(dir, "fieldgate.yaml")
	good := "storage: {path: " + filepath.Join(dir, "state.db") + "}\nbroker: {allow_anonymous: true}\nlisteners: [{name: default, type: tcp, address: \"" + addr + "\"}]\nops: {address: \"\"}\nsensors: []\noutputs: []\n"
	if err := os.WriteFile(cfgPath, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	var out testkit.Buffer
	cmd := exec.Command(binary, "run", "-config", cfgPath) // NOTIFY_SOCKET is in its environment
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("gateway output:\n%s", out.String())
		}
	}()

	ready := ns.WaitFor(t, "READY=1", 0)
	if c, err := net.Dial("tcp", addr); err != nil {
		t.Errorf("READY=1 came before the listener accepted: %v", err)
	} else {
		c.Close()
	}
	ns.WaitFor(t, "STATUS=", 0)

	// A good reload: the log level goes to debug.
	if err := os.WriteFile(cfgPath, []byte("log: {level: debug}\n"+good), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Signal(syscall.SIGHUP)
	r := ns.WaitFor(t, "RELOADING=1", ready+1)
	ns.WaitFor(t, "READY=1", r+1)

	// A bad file is refused; the gateway goes on.
	if err := os.WriteFile(cfgPath, []byte("log: {level: loud}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Signal(syscall.SIGHUP)
	testkit.WaitFor(t, 10*time.Second, "a log line refusing the bad configuration, naming log.level", func() bool {
		return strings.Contains(out.String(), "reload refused") && strings.Contains(out.String(), "log.level")
	})
	if c, err := net.Dial("tcp", addr); err != nil {
		t.Errorf("the gateway stopped serving after a refused reload: %v", err)
	} else {
		c.Close()
	}

	_ = cmd.Process.Signal(syscall.SIGTERM)
	ns.WaitFor(t, "STOPPING=1", 0)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v", err)
		}
	case <-time.After(testkit.Scale(15 * time.Second)):
		t.Fatal("the gateway did not exit after SIGTERM")
	}
}
