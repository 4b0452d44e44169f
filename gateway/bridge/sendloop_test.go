package bridge

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit/mosquitto"
	"github.com/fieldgate/fieldgate/storage"
)

// TestIdleLinkTicksOnceASecond: a connected bridge with nothing to send
// turns its loop for the watchdog's beat alone, once a second, where it
// used to turn fifty times a second; and a message sent after the quiet
// still goes at once.
func TestIdleLinkTicksOnceASecond(t *testing.T) {
	up := mosquitto.Start(t, mosquitto.Config{})
	w := watch(t, up.Addr(), "watcher", "up/#", false)
	db, err := storage.Open(filepath.Join(t.TempDir(), "state.db"), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	var mu sync.Mutex
	var beats []time.Time
	cfg := parseBridge(t, "bridges:\n  - name: cloud\n"+bridgeYAML(up.Addr(), "    out:\n      - {filter: \"data/#\", topic: \"up/{2}\"}\n"))
	br, err := New(cfg, Options{Device: "gw1", Store: db, Alive: func() {
		mu.Lock()
		beats = append(beats, time.Now())
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	br.Start(context.Background(), nil)
	t.Cleanup(br.Stop)
	waitFor(t, "the link", func() bool { return br.Stats().State == StateConnected })
	mu.Lock()
	from := len(beats)
	mu.Unlock()
	const n = 5
	waitFor(t, "five beats of an idle link", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(beats) >= from+n
	})
	mu.Lock()
	span := beats[from+n-1].Sub(beats[from])
	mu.Unlock()
	// Four intervals of a second; the first beat may come late, right
	// before the second, so three seconds is the least a correct loop
	// takes, and an old 20 ms tick took 80 ms.
	if span < 2500*time.Millisecond {
		t.Errorf("%d beats of an idle link within %v, want one a second", n, span)
	}

	var batch storage.Batch
	r := &br.rt.Load().outs[0]
	br.ob.put(r, "up/after", []byte("x"), false, &batch, time.Now())
	if err := db.CommitWait(&batch); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	waitFor(t, "the message after the quiet", func() bool { return w.count("up/after") == 1 })
	if d := time.Since(sent); d > 500*time.Millisecond {
		t.Logf("the message after the quiet took %v", d) // a loaded machine; the wake-up is what counts
	}
	waitFor(t, "its acknowledgement", func() bool { return br.Stats().Depth == 0 })
}
