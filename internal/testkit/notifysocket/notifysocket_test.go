package notifysocket

import (
	"net"
	"os"
	"testing"
	"time"
)

// send sends msg as a service would.
func send(msg string) error {
	c, err := net.Dial("unixgram", os.Getenv("NOTIFY_SOCKET"))
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write([]byte(msg))
	return err
}

// notify sends msg, failing the test if it cannot.
func notify(t *testing.T, msg string) {
	t.Helper()
	if err := send(msg); err != nil {
		t.Fatal(err)
	}
}

func TestSocket(t *testing.T) {
	s := Listen(t)
	if got := os.Getenv("NOTIFY_SOCKET"); got != s.Path() {
		t.Fatalf("NOTIFY_SOCKET=%q, want %q", got, s.Path())
	}
	if msg := s.Next(50 * time.Millisecond); msg != "" {
		t.Fatalf("Next = %q before anything was sent", msg)
	}
	notify(t, "READY=1")
	notify(t, "STATUS=up")
	notify(t, "READY=1")
	if i := s.WaitFor(t, "READY=1", 0); i != 0 {
		t.Fatalf("WaitFor(READY=1, 0) = %d, want 0", i)
	}
	if i := s.WaitFor(t, "READY=1", 1); i != 2 {
		t.Fatalf("WaitFor(READY=1, 1) = %d, want 2", i)
	}
	for _, want := range []string{"READY=1", "STATUS=up", "READY=1", ""} {
		if got := s.Next(50 * time.Millisecond); got != want {
			t.Fatalf("Next = %q, want %q", got, want)
		}
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		if err := send("STOPPING=1"); err != nil {
			t.Error(err)
		}
	}()
	if got := s.Next(10 * time.Second); got != "STOPPING=1" {
		t.Fatalf("Next = %q, want the datagram sent while it waited", got)
	}
}
