package reliability

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/relrecord"
)

// The fleet: gateways bridging into the cluster, gateway i to node i mod
// 3, each through a proxy of its own, under a steady load, through the
// fault timeline operators meet: a node killed (SIGKILL) and started
// again on its store, gateways SIGKILLed and started again on their state
// files, links cut hard (the proxy closes both ends) and links
// blackholed (the proxy forwards nothing and closes nothing, then resumes).
// make test runs three gateways through short faults; make soak as many
// as FIELDGATE_NATS_FLEET says, natsSoakFleet unless it says otherwise,
// through a node down for 30 s and links silent for 20 s.
const natsFleetEnv = "FIELDGATE_NATS_FLEET"

// natsSoakFleet is the soak's fleet, as many gateways as a 2-core machine
// holds beside three NATS servers and the test. Measured on one (24 GiB,
// shared with other work): 50 gateways ran the short timeline at 20 msg/s
// each, 17 MiB resident and 2.7 % of a core apiece, and every one caught
// up within 13 s of each fault; at the soak's 5 msg/s a gateway takes
// about 1.7 %, so 50 take under a core. Memory is not the limit (under
// 1 GiB in all); CPU is, at about twice that number.
const natsSoakFleet = 50

// natsFleetSize is the number of gateways: FIELDGATE_NATS_FLEET when set.
func natsFleetSize(t *testing.T) int {
	size := relrecord.Pick(3, natsSoakFleet)
	if v := os.Getenv(natsFleetEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a number of gateways, 1 or more", natsFleetEnv, v)
		}
		size = n
	}
	return size
}

// The fleet's timeline. Each fault ends, then the fleet settles: every
// gateway has delivered what it published before the fault ended.
var (
	// natsFleetRate is each gateway's load in messages a second: in the
	// soak, 50 gateways at 5 give NATS 250 a second to store three times.
	natsFleetRate = relrecord.Pick(20.0, 5.0)
	// natsFleetWarm is the steady traffic before the first fault, over
	// which each gateway's CPU is measured.
	natsFleetWarm = relrecord.Pick(3*time.Second, time.Minute)
	// natsNodeDown is how long the killed node stays down.
	natsNodeDown = relrecord.Pick(5*time.Second, 30*time.Second)
	// natsBlackhole is how long the blackholed links pass nothing: in the
	// soak longer than keepalive and ack_timeout, so that the bridges
	// notice and dial again (into the same silence) before it resumes.
	natsBlackhole = relrecord.Pick(5*time.Second, 20*time.Second)
	// natsSettle is the steady traffic after each fault has drained.
	natsSettle = relrecord.Pick(time.Second, 20*time.Second)
)

// natsFleet runs the fleet through the timeline and counts, per gateway,
// what the stream stored.
func natsFleet(t *testing.T, w *natsWorld) {
	size := natsFleetSize(t)
	c := newNATSCase(t, fmt.Sprintf("fleet of %d gateways", size))
	began := time.Now()
	nodes := w.cluster.Nodes()
	var gws []*natsGateway
	for i := range size {
		gws = append(gws, w.startGateway(t, fmt.Sprintf("fleet%03d", i), nodes[i%len(nodes)], true, natsBridgeOpts{}, natsFleetRate))
	}
	for _, ng := range gws {
		w.awaitFirst(t, ng)
	}
	c.add("gateways", "%d, gateway i bridging to node i mod %d through a proxy of its own, %.0f msg/s each at QoS 1",
		size, len(nodes), natsFleetRate)
	natsFleetCost(c, w, gws, natsFleetWarm)

	// Each fault hits every third gateway, a different third each time,
	// so that the others run on beside it.
	third := func(k int) []*natsGateway {
		var out []*natsGateway
		for i, ng := range gws {
			if i%3 == k%3 {
				out = append(out, ng)
			}
		}
		return out
	}
	var timeline []string
	fault := func(what string, do func()) {
		t.Helper()
		if t.Failed() {
			// A fault not caught up after: the final count says
			// what is missing, without waiting for it after each
			// fault to come.
			timeline = append(timeline, what+": not made, the case had failed")
			return
		}
		do()
		caught := natsCatchUp(c, w, gws, what)
		timeline = append(timeline, fmt.Sprintf("%s: every gateway caught up %s after it ended", what, caught.Round(time.Millisecond)))
		time.Sleep(natsSettle)
	}

	victim := nodes[0]
	fault(fmt.Sprintf("node %s SIGKILLed for %s (%d gateways' node)", victim.Name(), natsNodeDown, len(third(0))), func() {
		victim.Kill()
		time.Sleep(natsNodeDown)
		victim.Start()
	})
	fault(fmt.Sprintf("%d gateways SIGKILLed and started again on their state files", len(third(1))), func() {
		for _, ng := range third(1) {
			ng.g.kill()
			ng.g.start()
		}
	})
	fault(fmt.Sprintf("%d links cut hard", len(third(2))), func() {
		for _, ng := range third(2) {
			ng.proxy.Cut()
		}
	})
	fault(fmt.Sprintf("%d links blackholed for %s, then resumed", len(third(3)), natsBlackhole), func() {
		for _, ng := range third(3) {
			ng.proxy.Freeze()
		}
		time.Sleep(natsBlackhole)
		for _, ng := range third(3) {
			ng.proxy.Thaw()
		}
	})
	c.add("timeline", "%s", strings.Join(timeline, "; "))
	c.add("final drain", "%s", c.drain(w, gws).Round(time.Millisecond))

	// Connections since each gateway's last start: every fault above
	// ends some links, and none may set off a storm.
	var links []float64
	for _, ng := range gws {
		n := ng.reconnects(t)
		links = append(links, n)
		if bound := natsStormBound(time.Since(began)); n > bound {
			c.fail("%s: %.0f connections in %s, more than the backoff allows (%.0f)", ng.device, n, time.Since(began).Round(time.Second), bound)
		}
	}
	c.add("bridge connections", "mean %.1f, max %.0f a gateway (since its last start)", natsMean(links), slices.Max(links))
	// Every link is healthy again once the faults have drained.
	for _, ng := range gws {
		if n := ng.series(t, "fieldgate_bridge_failing_attempts", "}"); n != 0 {
			c.fail("%s: %.0f connection attempts in a row have failed after the faults ended", ng.device, n)
		}
	}

	var total natsCount
	var per []string
	for _, ng := range gws {
		n := c.check(w, ng)
		total.published += n.published
		total.acked += n.acked
		total.arrived += n.arrived
		total.lost += n.lost
		total.duplicates += n.duplicates
		total.outOfOrder += n.outOfOrder
		per = append(per, fmt.Sprintf("%s %d/%d/%d/%d", ng.device, n.acked, n.lost, n.duplicates, n.outOfOrder))
	}
	c.counted(total)
	c.add("per gateway (acknowledged/lost/duplicates/out of order)", "%s", strings.Join(per, ", "))
	c.add("run time", "%s", time.Since(began).Round(time.Second))
}

// natsCatchUp waits until every gateway's stream holds what the gateway
// acknowledged of the messages published before the call, and returns
// how long that took.
func natsCatchUp(c *natsCase, w *natsWorld, gws []*natsGateway, fault string) time.Duration {
	c.t.Helper()
	upTo := make([]int, len(gws))
	for i, ng := range gws {
		upTo[i] = ng.pub.ledger().published
	}
	return c.await(w, gws, upTo, "after the end of the fault: "+fault)
}

// natsFleetCost measures the gateways' and the NATS servers' CPU over d
// of steady load, and their resident memory at its end.
func natsFleetCost(c *natsCase, w *natsWorld, gws []*natsGateway, d time.Duration) {
	c.t.Helper()
	cpu0 := make([]time.Duration, len(gws))
	for i, ng := range gws {
		cpu0[i] = slowCPU(ng.g.pid())
	}
	nodes := w.cluster.Nodes()
	ncpu0 := make([]time.Duration, len(nodes))
	for i, n := range nodes {
		ncpu0[i] = slowCPU(n.PID())
	}
	start := time.Now()
	time.Sleep(d)
	wall := time.Since(start)
	var cpus, rss []float64
	for i, ng := range gws {
		cpus = append(cpus, 100*float64(slowCPU(ng.g.pid())-cpu0[i])/float64(wall))
		rss = append(rss, float64(ng.g.rss())/(1<<20))
	}
	var ncpus []string
	for i, n := range nodes {
		ncpus = append(ncpus, fmt.Sprintf("%s %.1f %%", n.Name(), 100*float64(slowCPU(n.PID())-ncpu0[i])/float64(wall)))
	}
	c.add("gateway CPU", "mean %.2f %%, max %.2f %% of a core over %s of steady load", natsMean(cpus), slices.Max(cpus), wall.Round(time.Second))
	c.add("gateway RSS", "mean %.1f MiB, max %.1f MiB", natsMean(rss), slices.Max(rss))
	c.add("NATS CPU", "%s of a core", strings.Join(ncpus, ", "))
}

// natsMean is the mean of xs, which is not empty.
func natsMean(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}
