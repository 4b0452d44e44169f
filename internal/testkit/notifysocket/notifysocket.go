// Package notifysocket is a real datagram socket standing in for the one
// systemd gives a Type=notify service in NOTIFY_SOCKET: a test reads what
// the code under test, in process or as a child process, tells systemd
// (READY=1, STATUS=…, WATCHDOG=1, …), one datagram a message.
package notifysocket

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
)

// waitMessage bounds WaitFor, before the time scale: far above how long a
// gateway takes to start, reload or stop.
const waitMessage = 20 * time.Second

// Socket receives notifications from the moment Listen returns; none is
// lost to a test that was not yet reading.
type Socket struct {
	conn *net.UnixConn
	path string
	done chan struct{} // closed when the reader has stopped

	mu      sync.Mutex
	msgs    []string
	arrived chan struct{} // closed and replaced at each datagram
	read    int           // how many Next has returned
}

// Listen opens a socket for the test, sets NOTIFY_SOCKET to it for the
// test's duration (children started with os.Environ inherit it), and
// closes it when the test ends.
func Listen(t testing.TB) *Socket {
	t.Helper()
	// A short directory: socket paths are limited to 107 bytes, which a
	// test's own TempDir can pass.
	dir, err := os.MkdirTemp("", "sdn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	s := &Socket{conn: conn, path: path, done: make(chan struct{}), arrived: make(chan struct{})}
	go s.receive()
	t.Cleanup(func() {
		conn.Close()
		<-s.done
	})
	t.Setenv("NOTIFY_SOCKET", path)
	return s
}

// Path returns the socket's file name, the value of NOTIFY_SOCKET.
func (s *Socket) Path() string { return s.path }

func (s *Socket) receive() {
	defer close(s.done)
	buf := make([]byte, 4096)
	for {
		n, err := s.conn.Read(buf)
		if err != nil {
			return
		}
		s.mu.Lock()
		s.msgs = append(s.msgs, string(buf[:n]))
		close(s.arrived)
		s.arrived = make(chan struct{})
		s.mu.Unlock()
	}
}

// Next returns the next datagram that Next has not returned yet, or ""
// when none arrives within wait. wait is not scaled: a test that watches
// for a datagram that must not come chooses how long.
func (s *Socket) Next(wait time.Duration) string {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		s.mu.Lock()
		if s.read < len(s.msgs) {
			msg := s.msgs[s.read]
			s.read++
			s.mu.Unlock()
			return msg
		}
		arrived := s.arrived
		s.mu.Unlock()
		select {
		case <-arrived:
		case <-timer.C:
			return ""
		}
	}
}

// WaitFor waits until a datagram containing want has arrived after the
// first skip ones, and returns its index among all that arrived. It fails
// the test if none has within the scaled deadline.
func (s *Socket) WaitFor(t testing.TB, want string, skip int) int {
	t.Helper()
	limit := testkit.Scale(waitMessage)
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		s.mu.Lock()
		for i := skip; i < len(s.msgs); i++ {
			if strings.Contains(s.msgs[i], want) {
				s.mu.Unlock()
				return i
			}
		}
		arrived, got := s.arrived, append([]string(nil), s.msgs...)
		s.mu.Unlock()
		select {
		case <-arrived:
		case <-timer.C:
			t.Fatalf("no %q after the first %d notifications within %v; got %q", want, skip, limit, got)
			return 0
		}
	}
}
