// Package systemd is fieldgate's side of the service manager's protocols:
// readiness and status over sd_notify, a watchdog that pings only while
// every registered component makes progress, and the sockets systemd
// passes at socket activation.
//
// Everything here degrades to nothing outside systemd: without
// NOTIFY_SOCKET every Notifier method returns nil and sends nothing,
// without WATCHDOG_USEC RunWatchdog returns at once, and without
// LISTEN_FDS Listeners returns an empty map. The same binary therefore
// runs from a shell, a container or a unit unchanged.
package systemd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Notifier sends sd_notify messages; every method is a no-op (nil error)
// when NOTIFY_SOCKET is unset, so the same binary runs without systemd.
// A nil *Notifier is valid and disabled.
type Notifier struct {
	log     *slog.Logger
	enabled bool
	epoch   time.Time // beats store their last progress relative to it

	mu    sync.Mutex
	beats []*Beat
}

// NewNotifier returns a Notifier for the NOTIFY_SOCKET this process was
// started with; log receives the watchdog's reports and may be nil.
func NewNotifier(log *slog.Logger) *Notifier {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Notifier{log: log, enabled: os.Getenv("NOTIFY_SOCKET") != "", epoch: time.Now()}
}

// Enabled reports whether a service manager listens for notifications.
func (n *Notifier) Enabled() bool { return n != nil && n.enabled }

// Ready tells systemd that start-up, or a reload, has finished (READY=1).
func (n *Notifier) Ready() error { return n.send(daemon.SdNotifyReady) }

// Reloading tells systemd that a reload has begun (RELOADING=1); Ready
// ends it. The MONOTONIC_USEC field is what Type=notify-reload (systemd
// 253 and later) requires to tell this reload from an earlier one; plain
// Type=notify ignores it.
func (n *Notifier) Reloading() error {
	return n.send(daemon.SdNotifyReloading + "\n" + daemon.SdNotifyMonotonicUsec())
}

// Stopping tells systemd that shutdown has begun (STOPPING=1).
func (n *Notifier) Stopping() error { return n.send(daemon.SdNotifyStopping) }

// Status sets the one-line status `systemctl status` shows (STATUS=...).
func (n *Notifier) Status(s string) error {
	// A newline would end the assignment and start another one.
	return n.send("STATUS=" + strings.ReplaceAll(s, "\n", " "))
}

// send writes one datagram of newline-separated assignments.
func (n *Notifier) send(state string) error {
	if !n.Enabled() {
		return nil
	}
	if _, err := daemon.SdNotify(false, state); err != nil {
		first, _, _ := strings.Cut(state, "\n")
		return fmt.Errorf("systemd: notify %s: %w", first, err)
	}
	return nil
}

// Beat is one component's proof of progress for the watchdog. A nil *Beat
// is valid and does nothing.
type Beat struct {
	name       string
	maxSilence time.Duration
	epoch      time.Time
	last       atomic.Int64 // nanoseconds since epoch of the latest Alive
}

// Beat registers a component the watchdog vouches for: from now on it must
// call Alive at least once every maxSilence, or the pings stop.
func (n *Notifier) Beat(name string, maxSilence time.Duration) *Beat {
	if n == nil {
		return nil
	}
	b := &Beat{name: name, maxSilence: maxSilence, epoch: n.epoch}
	b.Alive()
	n.mu.Lock()
	n.beats = append(n.beats, b)
	n.mu.Unlock()
	return b
}

// Forget unregisters a beat whose component was stopped for good, as a
// bridge removed by a reload; it is not watched any more.
func (n *Notifier) Forget(b *Beat) {
	if n == nil || b == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for i, x := range n.beats {
		if x == b {
			n.beats = append(n.beats[:i], n.beats[i+1:]...)
			return
		}
	}
}

// Alive records that the component made progress; it is cheap enough for
// a hot loop.
func (b *Beat) Alive() {
	if b != nil {
		b.last.Store(int64(time.Since(b.epoch)))
	}
}

// silent reports how long the component has been quiet, as of now (time
// since the Notifier's epoch), when that is longer than it may be.
func (b *Beat) silent(now time.Duration) (time.Duration, bool) {
	quiet := now - time.Duration(b.last.Load())
	return quiet, quiet > b.maxSilence
}

// errNoWatchdog: WATCHDOG_USEC is unset, or WATCHDOG_PID names another
// process, which then owns the watchdog.
var errNoWatchdog = errors.New("no watchdog for this process")

// watchdogInterval returns how often to ping: half of WATCHDOG_USEC, as
// sd_watchdog_enabled(3) advises, so that one late ping is not fatal.
func watchdogInterval() (time.Duration, error) {
	d, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		return 0, err
	}
	if d == 0 {
		return 0, errNoWatchdog
	}
	return d / 2, nil
}

// RunWatchdog sends WATCHDOG=1 every WatchdogSec/2 (from WATCHDOG_USEC,
// honouring WATCHDOG_PID) only while every Beat reported within its
// maxSilence; when one is stuck it stops pinging, so that systemd restarts
// the service, and logs once which component is stuck. It returns when ctx
// ends, and at once without a watchdog.
func (n *Notifier) RunWatchdog(ctx context.Context) {
	if !n.Enabled() {
		return
	}
	interval, err := watchdogInterval()
	if err != nil {
		if !errors.Is(err, errNoWatchdog) {
			n.log.Warn("watchdog disabled", "err", err)
		}
		return
	}
	n.log.Debug("watchdog running", "interval", interval)
	t := time.NewTicker(interval)
	defer t.Stop()
	stuck := "" // names of the stuck components, as last logged
	for {
		names, detail := n.stuck()
		if names != stuck {
			if names != "" {
				n.log.Error("watchdog: component stuck, no longer pinging systemd", "stuck", detail)
			} else {
				n.log.Warn("watchdog: components making progress again, pinging systemd", "was_stuck", stuck)
			}
			stuck = names
		}
		if stuck == "" {
			if err := n.send(daemon.SdNotifyWatchdog); err != nil {
				n.log.Warn("watchdog ping failed", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// stuck names the components silent for longer than they may be, and
// the same with how long each has been; both are "" when all are making
// progress.
func (n *Notifier) stuck() (names, detail string) {
	now := time.Since(n.epoch)
	n.mu.Lock()
	defer n.mu.Unlock()
	var ns, ds []string
	for _, b := range n.beats {
		if quiet, late := b.silent(now); late {
			ns = append(ns, b.name)
			ds = append(ds, fmt.Sprintf("%s (silent %s, limit %s)", b.name, quiet.Round(time.Millisecond), b.maxSilence))
		}
	}
	return strings.Join(ns, ", "), strings.Join(ds, ", ")
}
