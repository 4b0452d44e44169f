package systemd

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/internal/testkit/notifysocket"
	"golang.org/x/sys/unix"
)

// fields splits a datagram into its assignments.
func fields(msg string) map[string]string {
	m := make(map[string]string)
	for _, line := range strings.Split(strings.TrimSuffix(msg, "\n"), "\n") {
		k, v, _ := strings.Cut(line, "=")
		m[k] = v
	}
	return m
}

func monotonicUsec(t *testing.T) int64 {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return ts.Nano() / 1000
}

func TestNotifyProtocol(t *testing.T) {
	sock := notifysocket.Listen(t)
	n := NewNotifier(nil)
	if !n.Enabled() {
		t.Fatal("Enabled() = false with NOTIFY_SOCKET set")
	}
	tests := []struct {
		name string
		send func() error
		want map[string]string
	}{
		{"ready", n.Ready, map[string]string{"READY": "1"}},
		{"status", func() error { return n.Status("3 clients, 12 queued") }, map[string]string{"STATUS": "3 clients, 12 queued"}},
		// A newline would smuggle in a second assignment.
		{"status newline", func() error { return n.Status("one\nREADY=1") }, map[string]string{"STATUS": "one READY=1"}},
		{"stopping", n.Stopping, map[string]string{"STOPPING": "1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.send(); err != nil {
				t.Fatal(err)
			}
			got := fields(sock.Next(testkit.Scale(2 * time.Second)))
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Fatalf("got %v, want %v", got, tt.want)
				}
			}
		})
	}

	t.Run("reloading", func(t *testing.T) {
		before := monotonicUsec(t)
		if err := n.Reloading(); err != nil {
			t.Fatal(err)
		}
		after := monotonicUsec(t)
		got := fields(sock.Next(testkit.Scale(2 * time.Second)))
		if got["RELOADING"] != "1" {
			t.Fatalf("got %v, want RELOADING=1", got)
		}
		usec, err := strconv.ParseInt(got["MONOTONIC_USEC"], 10, 64)
		if err != nil {
			t.Fatalf("MONOTONIC_USEC: %v in %v", err, got)
		}
		if usec < before || usec > after {
			t.Fatalf("MONOTONIC_USEC=%d, want CLOCK_MONOTONIC at the call, in [%d, %d]", usec, before, after)
		}
	})
}

func TestNotifyWithoutSystemd(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	t.Setenv("WATCHDOG_USEC", "100000")
	n := NewNotifier(nil)
	if n.Enabled() {
		t.Fatal("Enabled() = true without NOTIFY_SOCKET")
	}
	for name, send := range map[string]func() error{
		"Ready": n.Ready, "Reloading": n.Reloading, "Stopping": n.Stopping,
		"Status": func() error { return n.Status("x") },
	} {
		if err := send(); err != nil {
			t.Errorf("%s: %v, want nil without NOTIFY_SOCKET", name, err)
		}
	}
	n.Beat("loop", time.Millisecond).Alive()
	returned := make(chan struct{})
	go func() { n.RunWatchdog(context.Background()); close(returned) }()
	select {
	case <-returned:
	case <-time.After(testkit.Scale(2 * time.Second)):
		t.Fatal("RunWatchdog did not return without NOTIFY_SOCKET")
	}

	// A nil Notifier, as a component without systemd may hold, is inert.
	var none *Notifier
	if none.Enabled() || none.Ready() != nil || none.Beat("x", time.Second) != nil {
		t.Fatal("nil Notifier is not inert")
	}
	none.Beat("x", time.Second).Alive()
}

func TestNotifyUnreachableSocket(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "nobody-listens"))
	err := NewNotifier(nil).Ready()
	if err == nil || !strings.Contains(err.Error(), "READY=1") {
		t.Fatalf("Ready() = %v, want an error naming READY=1", err)
	}
}

// pinger keeps a Beat alive from its own goroutine until paused, as a
// component's loop would.
type pinger struct {
	beat   *Beat
	paused chan bool
	done   chan struct{}
}

func startPinger(b *Beat) *pinger {
	p := &pinger{beat: b, paused: make(chan bool), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		paused := false
		for {
			select {
			case v, ok := <-p.paused:
				if !ok {
					return
				}
				paused = v
			case <-t.C:
				if !paused {
					p.beat.Alive()
				}
			}
		}
	}()
	return p
}

func (p *pinger) pause(v bool) { p.paused <- v }
func (p *pinger) stop()        { close(p.paused); <-p.done }

// countPings counts WATCHDOG=1 datagrams during d and fails on any other
// message.
func countPings(t *testing.T, sock *notifysocket.Socket, d time.Duration) int {
	t.Helper()
	n := 0
	for end := time.Now().Add(d); time.Now().Before(end); {
		msg := sock.Next(time.Until(end))
		switch msg {
		case "":
		case "WATCHDOG=1":
			n++
		default:
			t.Fatalf("unexpected notification %q", msg)
		}
	}
	return n
}

func TestWatchdogPingsOnlyWhileAllBeatsAlive(t *testing.T) {
	const (
		watchdog   = 200 * time.Millisecond
		interval   = watchdog / 2
		maxSilence = 150 * time.Millisecond
	)
	sock := notifysocket.Listen(t)
	t.Setenv("WATCHDOG_USEC", strconv.Itoa(int(watchdog/time.Microsecond)))
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	var logs testkit.Buffer
	n := NewNotifier(slog.New(slog.NewTextHandler(&logs, nil)))
	broker := startPinger(n.Beat("broker", maxSilence))
	defer broker.stop()
	poller := startPinger(n.Beat("poller", maxSilence))
	defer poller.stop()

	ctx, cancel := context.WithCancel(context.Background())
	returned := make(chan struct{})
	go func() { n.RunWatchdog(ctx); close(returned) }()
	defer func() { cancel(); <-returned }()

	// Alive: a ping every interval, so about 8 in 8 intervals.
	if got := countPings(t, sock, 8*interval); got < 5 {
		t.Fatalf("%d pings in %s while every beat is alive, want about 8", got, 8*interval)
	}

	// The poller stalls: within maxSilence plus one interval the pings
	// stop, and stay stopped.
	poller.pause(true)
	countPings(t, sock, maxSilence+2*interval)
	if got := countPings(t, sock, 6*interval); got != 0 {
		t.Fatalf("%d pings in %s after the poller stalled, want none", got, 6*interval)
	}
	if l := logs.String(); !strings.Contains(l, "stuck=\"poller (silent") || strings.Contains(l, "broker (silent") {
		t.Fatalf("log does not name the poller, and only it, as stuck:\n%s", l)
	}
	if c := strings.Count(logs.String(), "component stuck"); c != 1 {
		t.Fatalf("stuck component logged %d times, want once:\n%s", c, logs.String())
	}

	// It recovers: the pings resume.
	poller.pause(false)
	if got := countPings(t, sock, 4*interval); got < 2 {
		t.Fatalf("%d pings in %s after the poller recovered, want about 3", got, 4*interval)
	}
	if !strings.Contains(logs.String(), "making progress again") {
		t.Fatalf("recovery not logged:\n%s", logs.String())
	}

	// RunWatchdog ends with its context.
	cancel()
	select {
	case <-returned:
	case <-time.After(testkit.Scale(2 * time.Second)):
		t.Fatal("RunWatchdog did not return after its context ended")
	}
}

func TestWatchdogDisabled(t *testing.T) {
	tests := []struct {
		name, usec, pid string
		logs            string // what the log must mention, if anything
	}{
		{"no WATCHDOG_USEC", "", "", ""},
		{"another process's watchdog", "200000", strconv.Itoa(os.Getpid() + 1), ""},
		{"malformed WATCHDOG_USEC", "soon", "", "watchdog disabled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sock := notifysocket.Listen(t)
			t.Setenv("WATCHDOG_USEC", tt.usec)
			t.Setenv("WATCHDOG_PID", tt.pid)
			var logs testkit.Buffer
			n := NewNotifier(slog.New(slog.NewTextHandler(&logs, nil)))
			returned := make(chan struct{})
			go func() { n.RunWatchdog(context.Background()); close(returned) }()
			select {
			case <-returned:
			case <-time.After(testkit.Scale(2 * time.Second)):
				t.Fatal("RunWatchdog kept running without a watchdog for this process")
			}
			if msg := sock.Next(100 * time.Millisecond); msg != "" {
				t.Fatalf("sent %q without a watchdog", msg)
			}
			if !strings.Contains(logs.String(), tt.logs) {
				t.Fatalf("log lacks %q:\n%s", tt.logs, logs.String())
			}
		})
	}
}
