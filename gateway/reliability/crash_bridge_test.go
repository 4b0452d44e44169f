package reliability

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/fieldgate/fieldgate/internal/relrecord"
	"github.com/fieldgate/fieldgate/internal/testkit/mosquitto"
)

// TestCrashBridge kills the gateway while its bridge's upstream is away
// and again while the outbox is being replayed to it: every message the
// gateway acknowledged must reach the cloud subscriber. TestCrash kills
// it with the link up; this covers the two states it rarely lands in.
func TestCrashBridge(t *testing.T) {
	kills, seed := crashParams(t)
	rec := relrecord.Begin(t, "crash", "bridge outage+replay")
	rec.Add("kills", "%d during the outage, %d during replay", kills, kills)
	rec.Add("seed", "%d (FIELDGATE_CRASH_SEED)", seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	bin := buildGateway(t, t.TempDir())
	up := mosquitto.Start(t, mosquitto.Cloud())

	// The cloud application: a persistent session that is offline while
	// the gateway is killed, so the upstream queues all it is sent.
	cloud := crashCloud(t, rec, up.Addr(), "cloud-app", 1)
	g := newGatewayWith(t, bin, crashBridgeYAML(up.Addr(), "crash/#", 1))
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
	if !cycles(t, rec, g, kills, rng, load, nil) {
		return
	}
	outage := len(l.acked)

	// Replay: the upstream is back; each start replays the outbox and is
	// killed part way, with publishers still adding to it.
	up.Start()
	for range kills {
		g.start()
		if !cycles(t, rec, g, 1, rng, load, nil) {
			return
		}
	}
	g.start()
	for _, p := range pubs {
		for _, msg := range p.problems {
			crashFail(t, rec, "%s: %s", p.id, msg)
		}
	}
	// The cloud application comes back while the last start empties the
	// outbox, and takes everything the upstream queued for it.
	crashCloudFollow(t, rec, up.Addr(), cloud)(g, l)
	g.stop()
	g.checkState()

	rec.Add("acknowledged during the outage", "%d", outage)
	crashLedger(t, rec, l)
	upstream := verify(t, rec, "upstream", l, []*receiver{cloud}, crashUpstreamDups(l))
	rec.Add("lost (upstream)", "%d", upstream.lost)
	rec.Add("QoS 1 duplicates (upstream)", "%d", upstream.dups)
}
