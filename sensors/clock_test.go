package sensors

import (
	"sync"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
)

// fakeClock is a Clock whose time moves only when a test steps it, and only
// once every poller goroutine is waiting (see BusyTracker), so schedules
// are tested exactly and without sleeping.
type fakeClock struct {
	t      *testing.T
	mu     sync.Mutex
	cond   *sync.Cond
	now    time.Time
	busy   int
	timers map[*fakeTimer]struct{} // armed
}

func newFakeClock(t *testing.T) *fakeClock {
	c := &fakeClock{t: t, now: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC), timers: map[*fakeTimer]struct{}{}}
	c.cond = sync.NewCond(&c.mu)
	return c
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Busy(d int) {
	c.mu.Lock()
	c.busy += d
	c.cond.Broadcast()
	c.mu.Unlock()
}

func (c *fakeClock) NewTimer(d time.Duration) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	ft := &fakeTimer{c: c, ch: make(chan time.Time, 1), at: c.now.Add(d)}
	c.timers[ft] = struct{}{}
	return ft
}

// waitIdle blocks until no poller goroutine is working.
func (c *fakeClock) waitIdle() {
	c.t.Helper()
	deadline := time.Now().Add(testkit.Scale(10 * time.Second))
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.busy > 0 {
		if time.Now().After(deadline) {
			c.t.Fatalf("poller still busy (%d) after %v of real time", c.busy, testkit.Scale(10*time.Second))
		}
		c.mu.Unlock()
		time.Sleep(100 * time.Microsecond)
		c.mu.Lock()
	}
	if c.busy < 0 {
		c.t.Fatalf("busy count went negative: %d", c.busy)
	}
}

// step waits for the poller to be idle, then moves time to the earliest
// armed timer (but not past limit) and fires every timer due by then.
// It reports false when no timer is due by limit.
func (c *fakeClock) step(limit time.Time) bool {
	c.waitIdle()
	c.mu.Lock()
	defer c.mu.Unlock()
	var next time.Time
	for ft := range c.timers {
		if next.IsZero() || ft.at.Before(next) {
			next = ft.at
		}
	}
	if next.IsZero() || next.After(limit) {
		if limit.After(c.now) {
			c.now = limit
		}
		return false
	}
	if next.After(c.now) {
		c.now = next
	}
	for ft := range c.timers {
		if !ft.at.After(c.now) {
			delete(c.timers, ft)
			c.busy++ // the waiter wakes; it counts itself busy from here
			ft.ch <- c.now
		}
	}
	return true
}

// run steps until d of fake time has passed.
func (c *fakeClock) run(d time.Duration) {
	end := c.Now().Add(d)
	for c.step(end) {
	}
	c.waitIdle()
}

type fakeTimer struct {
	c  *fakeClock
	ch chan time.Time
	at time.Time
}

func (ft *fakeTimer) C() <-chan time.Time { return ft.ch }

// Stop disarms the timer; a tick fired but not received is taken back
// along with the wake-up it was counted as.
func (ft *fakeTimer) Stop() bool {
	ft.c.mu.Lock()
	defer ft.c.mu.Unlock()
	_, armed := ft.c.timers[ft]
	delete(ft.c.timers, ft)
	select {
	case <-ft.ch:
		ft.c.busy--
	default:
	}
	return armed
}

func (ft *fakeTimer) Reset(d time.Duration) bool {
	armed := ft.Stop()
	ft.c.mu.Lock()
	defer ft.c.mu.Unlock()
	ft.at = ft.c.now.Add(d)
	ft.c.timers[ft] = struct{}{}
	return armed
}
