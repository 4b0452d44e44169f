package bridge

import (
	"sync"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit/mosquitto"
)

// TestIdleLinkTicksOnceASecond: a connected bridge with nothing to send
// turns its loop for the watchdog's beat alone, once a second, where it
// used to turn fifty times a second; and a message sent after the quiet
// still goes at once.
func TestIdleLinkTicksOnceASecond(t *testing.T) {
	up := mosquitto.Start(t, mosquitto.Config{})
	w := watch(t, up.Addr(), "watcher", "up/#", false)
	var mu sync.Mutex
	var beats []time.Time
	br := newLoneBridgeAlive(t, bridgeYAML(up.Addr(), "    out:\n      - {filter: \"data/#\", topic: \"up/{2}\"}\n"), func() {
		mu.Lock()
		beats = append(beats, time.Now())
		mu.Unlock()
	})
	waitFor(t, "the link", func() bool { return br.Stats().State == StateConnected })
	mu.Lock()
	from := len(beats)
	mu.Unlock()
	// The link's start calls alive up to three times between its steps;
	// the beats after those are the idle loop's.
	const skip, n = 3, 4
	waitFor(t, "the beats of an idle link", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(beats) >= from+skip+n
	})
	mu.Lock()
	span := beats[from+skip+n-1].Sub(beats[from+skip])
	mu.Unlock()
	// Three intervals of a second; the first beat may come late, right
	// before the second, so two seconds is the least a correct loop
	// takes, and an old 20 ms tick took 60 ms.
	if span < 1500*time.Millisecond {
		t.Errorf("%d beats of an idle link within %v, want one a second", n, span)
	}

	br.queue(t, "up/after")
	sent := time.Now()
	waitFor(t, "the message after the quiet", func() bool { return w.count("up/after") == 1 })
	if d := time.Since(sent); d > 500*time.Millisecond {
		t.Logf("the message after the quiet took %v", d) // a loaded machine; the wake-up is what counts
	}
	waitFor(t, "its acknowledgement", func() bool { return br.Stats().Depth == 0 })
}
