package upstreamtest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// TestProxyFreeze checks the proxy: it forwards, goes silent on Freeze
// without closing either side, and forwards what it held on Thaw.
func TestProxyFreeze(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
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
	p := NewProxy(t, echo.Addr().String())
	c, err := net.DialTimeout("tcp", p.Addr(), Wait)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip := func(msg string) error {
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
	_ = c.SetDeadline(time.Now().Add(Wait))
	if err := roundTrip("before"); err != nil {
		t.Fatal(err)
	}
	p.Freeze()
	if _, err := c.Write([]byte("during")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if n, err := c.Read(make([]byte, 16)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("frozen proxy: read %d bytes, err %v; want silence", n, err)
	}
	if p.Held() == 0 {
		t.Fatal("frozen proxy holds nothing of what was written")
	}
	p.Thaw()
	_ = c.SetDeadline(time.Now().Add(Wait))
	got := make([]byte, len("during"))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "during" {
		t.Fatalf("after thaw: %q, %v; want the held bytes", got, err)
	}
	if err := roundTrip("after"); err != nil {
		t.Fatal(err)
	}
	if p.UpSent() != int64(len("before")+len("during")+len("after")) {
		t.Fatalf("UpSent %d, want %d", p.UpSent(), len("before")+len("during")+len("after"))
	}
}
