package systemd

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
)

// childEnv marks the test binary re-executed as a socket-activated child.
const childEnv = "FIELDGATE_TEST_ACTIVATION_CHILD"

// activatedChild is the test binary re-executed with sockets passed the
// way systemd passes them: as file descriptors 3 and up, with LISTEN_FDS,
// LISTEN_FDNAMES and a LISTEN_PID naming the child itself, which only the
// child's own shell can know ($$ survives the exec).
type activatedChild struct {
	cmd        *exec.Cmd
	lines      chan string
	transcript []string
}

// startActivated listens on one loopback port per name and starts the
// child with those sockets; it returns the addresses in the same order.
func startActivated(t *testing.T, fdnames string, n int) (*activatedChild, []string) {
	t.Helper()
	var files []*os.File
	var addrs []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		f, err := l.(*net.TCPListener).File()
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, l.Addr().String())
		// The child gets the duplicate in f; the parent keeps no listener.
		l.Close()
		files = append(files, f)
		t.Cleanup(func() { f.Close() })
	}
	cmd := exec.Command("/bin/sh", "-c", `LISTEN_PID=$$ exec "$0" "$@"`,
		os.Args[0], "-test.run=^TestListenersChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), childEnv+"=1", fmt.Sprintf("LISTEN_FDS=%d", n), "LISTEN_FDNAMES="+fdnames)
	cmd.ExtraFiles = files
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c := &activatedChild{cmd: cmd, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	return c, addrs
}

// waitFor returns the rest of the first line the child prints that starts
// with prefix.
func (c *activatedChild) waitFor(t *testing.T, prefix string) string {
	t.Helper()
	limit := testkit.Scale(20 * time.Second)
	timeout := time.After(limit)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("child exited before printing %q:\n%s", prefix, strings.Join(c.transcript, "\n"))
			}
			c.transcript = append(c.transcript, l)
			if strings.HasPrefix(l, prefix) {
				return strings.TrimPrefix(l, prefix)
			}
		case <-timeout:
			t.Fatalf("child printed no %q in %v:\n%s", prefix, limit, strings.Join(c.transcript, "\n"))
		}
	}
}

func TestListenersInherited(t *testing.T) {
	names := []string{"default", "websocket"}
	child, addrs := startActivated(t, strings.Join(names, ":"), len(names))
	if got := child.waitFor(t, "listeners: "); got != "default websocket" {
		t.Fatalf("child's Listeners() names = %q, want %q", got, "default websocket")
	}
	if got := child.waitFor(t, "env after: "); got != "LISTEN_PID= LISTEN_FDS= LISTEN_FDNAMES=" {
		t.Fatalf("child's environment after Listeners() = %q, want the variables unset", got)
	}
	// The child serves one connection on each socket by writing that
	// socket's name to it.
	for i, addr := range addrs {
		c, err := net.DialTimeout("tcp", addr, testkit.Scale(5*time.Second))
		if err != nil {
			t.Fatalf("dial %s (%s): %v", names[i], addr, err)
		}
		_ = c.SetDeadline(time.Now().Add(testkit.Scale(10 * time.Second)))
		b, err := io.ReadAll(c)
		c.Close()
		if err != nil {
			t.Fatalf("read from %s: %v", names[i], err)
		}
		if string(b) != names[i] {
			t.Fatalf("socket %s answered as %q: the names are not on the right descriptors", names[i], b)
		}
	}
	child.waitFor(t, "served: ")
	if err := child.cmd.Wait(); err != nil {
		t.Fatalf("child: %v\n%s", err, strings.Join(child.transcript, "\n"))
	}
}

// TestListenersDuplicateName: two sockets under one name would leave one
// of them unserved, so Listeners refuses them.
func TestListenersDuplicateName(t *testing.T) {
	child, _ := startActivated(t, "default:default", 2)
	if got := child.waitFor(t, "error: "); !strings.Contains(got, `two sockets named "default"`) {
		t.Fatalf("child's Listeners() error = %q, want one naming the duplicate", got)
	}
}

// TestListenersChild is the socket-activated side of
// TestListenersInherited; run on its own it does nothing.
func TestListenersChild(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("runs only as TestListenersInherited's child")
	}
	ls, err := Listeners()
	if err != nil {
		fmt.Printf("error: %v\n", err)
		return
	}
	var names []string
	for name := range ls {
		names = append(names, name)
	}
	sort.Strings(names)
	fmt.Printf("listeners: %s\n", strings.Join(names, " "))
	fmt.Printf("env after: LISTEN_PID=%s LISTEN_FDS=%s LISTEN_FDNAMES=%s\n",
		os.Getenv("LISTEN_PID"), os.Getenv("LISTEN_FDS"), os.Getenv("LISTEN_FDNAMES"))
	for _, name := range names {
		l := ls[name]
		if tl, ok := l.(*net.TCPListener); ok {
			_ = tl.SetDeadline(time.Now().Add(testkit.Scale(15 * time.Second)))
		}
		c, err := l.Accept()
		if err != nil {
			t.Fatalf("accept on %s: %v", name, err)
		}
		_, _ = io.WriteString(c, name)
		c.Close()
		l.Close()
	}
	fmt.Printf("served: %d\n", len(names))
}

func TestListenersWithoutActivation(t *testing.T) {
	tests := []struct{ name, pid, fds string }{
		{"nothing passed", "", ""},
		// Variables inherited from a parent that was activated: the pid is
		// not ours, so descriptors 3 and up are not systemd's sockets.
		{"another process's sockets", "1", "2"},
		{"malformed LISTEN_FDS", "self", "two"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pid := tt.pid
			if pid == "self" {
				pid = fmt.Sprint(os.Getpid())
			}
			t.Setenv("LISTEN_PID", pid)
			t.Setenv("LISTEN_FDS", tt.fds)
			t.Setenv("LISTEN_FDNAMES", "default:websocket")
			ls, err := Listeners()
			if err != nil || ls == nil || len(ls) != 0 {
				t.Fatalf("Listeners() = %v, %v; want an empty map", ls, err)
			}
			for _, v := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
				if _, set := os.LookupEnv(v); set {
					t.Errorf("%s still set", v)
				}
			}
		})
	}
}
