package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
)

// echoServer accepts connections until the test ends and echoes what
// each sends.
func echoServer(t *testing.T) string {
	t.Helper()
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { echo.Close() })
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
	return echo.Addr().String()
}

// roundTrip writes msg on c and requires it echoed.
func roundTrip(c net.Conn, msg string) error {
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

// wait bounds every wait for bytes that should come.
var wait = testkit.Scale(20 * time.Second)

// dial connects to the proxy, with a deadline of wait on the connection;
// it closes with the test.
func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), wait)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(wait))
	return c
}

// silence is how long a test watches a frozen link for bytes that must
// not come: a duration under test, not a deadline.
const silence = 500 * time.Millisecond

// TestFreeze checks that the proxy forwards, goes silent on Freeze without
// closing either side, and forwards what it held on Thaw.
func TestFreeze(t *testing.T) {
	p := New(t, echoServer(t))
	c := dial(t, p)
	if err := roundTrip(c, "before"); err != nil {
		t.Fatal(err)
	}
	p.Freeze()
	if _, err := c.Write([]byte("during")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(silence))
	if n, err := c.Read(make([]byte, 16)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("frozen proxy: read %d bytes, err %v; want silence", n, err)
	}
	if p.Held() == 0 {
		t.Fatal("frozen proxy holds nothing of what was written")
	}
	p.Thaw()
	_ = c.SetDeadline(time.Now().Add(wait))
	got := make([]byte, len("during"))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "during" {
		t.Fatalf("after thaw: %q, %v; want the held bytes", got, err)
	}
	if err := roundTrip(c, "after"); err != nil {
		t.Fatal(err)
	}
	if p.UpSent() != int64(len("before")+len("during")+len("after")) {
		t.Fatalf("UpSent %d, want %d", p.UpSent(), len("before")+len("during")+len("after"))
	}
}

// TestHoldUpAfter checks that the client's bytes past the limit wait, the
// server's still flow, and Thaw lets the rest go.
func TestHoldUpAfter(t *testing.T) {
	p := New(t, echoServer(t))
	c := dial(t, p)
	p.HoldUpAfter(3)
	if _, err := c.Write([]byte("abcdef")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 3)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "abc" {
		t.Fatalf("below the limit: %q, %v; want abc", got, err)
	}
	testkit.WaitFor(t, 10*time.Second, "the rest held", func() bool { return p.Held() == 3 })
	_ = c.SetReadDeadline(time.Now().Add(silence))
	if n, err := c.Read(got); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("held proxy: read %d bytes, err %v; want silence", n, err)
	}
	p.Thaw()
	_ = c.SetDeadline(time.Now().Add(wait))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "def" {
		t.Fatalf("after thaw: %q, %v; want def", got, err)
	}
}

// TestCut checks that Cut closes a frozen connection, drops what it held,
// and forwards a new connection; AcceptedAfter tells when it came.
func TestCut(t *testing.T) {
	p := New(t, echoServer(t))
	c := dial(t, p)
	// A round trip: the proxy has accepted c before the freeze.
	if err := roundTrip(c, "first"); err != nil {
		t.Fatal(err)
	}
	p.Freeze()
	froze := time.Now()
	if _, err := c.Write([]byte("lost")); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "the bytes held", func() bool { return p.Held() == 4 })
	if _, ok := p.AcceptedAfter(froze); ok {
		t.Fatal("AcceptedAfter reports a connection before any came")
	}
	p.Cut()
	_ = c.SetReadDeadline(time.Now().Add(wait))
	if n, err := c.Read(make([]byte, 16)); !errors.Is(err, io.EOF) {
		t.Fatalf("cut connection: read %d bytes, err %v; want EOF", n, err)
	}
	testkit.WaitFor(t, 10*time.Second, "the held bytes dropped", func() bool { return p.Held() == 0 })
	c2 := dial(t, p)
	if err := roundTrip(c2, "again"); err != nil {
		t.Fatal(err)
	}
	if d, ok := p.AcceptedAfter(froze); !ok || d <= 0 {
		t.Fatalf("AcceptedAfter = %v, %v; want the new connection", d, ok)
	}
}
