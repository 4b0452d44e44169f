package reliability

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/gateway/bridge/upstreamtest"
)

// TestCrashBridge kills the gateway while its bridge's upstream is away
// and again while the outbox is being replayed to it: every message the
// gateway acknowledged must reach the cloud subscriber.
func TestCrashBridge(t *testing.T) {
	kills := defaultKills
	if v := os.Getenv("FIELDGATE_CRASH_KILLS"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			kills = n
		}
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("%d outage kills and %d replay kills; seed %d", kills, kills, seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	bin := buildGateway(t, t.TempDir())
	up := upstreamtest.Start(t)

	// The cloud application: a persistent session that is offline while
	// the gateway is killed, so the upstream queues all it is sent.
	cloud := &receiver{id: "cloud-app", qos: 1, got: map[string]int{}, rel: map[uint16]string{}}
	c, _, err := dial(up.Addr(), cloud.id, false, sessionExpiry, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.subscribe("up/#", 1); err != nil {
		t.Fatal(err)
	}
	c.disconnect()

	g := newGatewayWith(t, bin, fmt.Sprintf(`gateway: {name: crash}
bridges:
  - name: cloud
    address: %q
    reconnect_min: 100ms
    reconnect_max: 300ms
    ack_timeout: 5s
    rate: 0
    max_outbox_bytes: 1073741824
    out:
      - {filter: "crash/#", topic: "up/{topic}", qos: 1}
`, up.Addr()))
	l := newLedger()
	var pubs []*publisher
	for i := range 3 {
		id := fmt.Sprintf("bridge-pub-%d", i)
		pubs = append(pubs, &publisher{id: id, topic: "crash/" + id, qos: 1})
	}
	var load []func() error
	for _, p := range pubs {
		load = append(load, func() error { return p.run(g.addr, l) })
	}

	// Outage: the upstream is down while the gateway takes messages and
	// is killed mid-stream, again and again.
	up.Stop()
	g.start()
	if !cycles(t, g, kills, rng, load) {
		return
	}
	outage := len(l.acked)

	// Replay: the upstream is back; each start replays the outbox and is
	// killed part way, with publishers still adding to it.
	up.Start()
	for range kills {
		g.start()
		if !cycles(t, g, 1, rng, load) {
			return
		}
	}
	g.start()
	for _, p := range pubs {
		for _, msg := range p.problems {
			t.Errorf("%s: %s", p.id, msg)
		}
	}
	// Let the last start drain the outbox, then read the cloud's queue.
	deadline := time.Now().Add(2 * time.Minute)
	for cloud.missing(l) > 0 && time.Now().Before(deadline) {
		cc, err := cloud.connect(up.Addr(), 0)
		if err != nil {
			t.Fatalf("cloud subscriber: %v", err)
		}
		_ = cloud.receive(cc, drainQuiet, time.Now().Add(time.Minute))
		cc.disconnect()
	}
	g.stop()
	g.checkState()
	t.Logf("acknowledged %d during the outage, %d in all", outage, len(l.acked))
	verify(t, l, []*receiver{cloud}, len(l.acked))
}
