package report

import (
	"fmt"
	"strings"

	"github.com/fieldgate/fieldgate/scripts/bench/targets"
)

// brokerSummary is the broker comparison (bench-broker.sh): throughput,
// latency and memory of fieldgate's broker, mochi's Server and Mosquitto.
type brokerSummary struct{ *brokerRuns }

func (s brokerSummary) title() string { return "MQTT broker: fieldgate vs mochi-mqtt vs Mosquitto" }

func (s brokerSummary) intro(w *markdown) {
	m := s.meta
	s.writeHeader(w, "one broker at a time", []string{
		fmt.Sprintf("Go: %s", orUnknown(m.get("go"))),
		fmt.Sprintf("fieldgate: %s", orUnknown(m.get("fieldgate"))),
		fmt.Sprintf("mochi-mqtt: %s (its full `Server`: default options and capabilities, allow-all auth, one TCP listener)", orUnknown(m.get("mochi"))),
		fmt.Sprintf("Mosquitto: %s", orUnknown(m.get("mosquitto"))),
	}, "Ratios: throughput is fieldgate ÷ peer; latency and memory are peer ÷ fieldgate. "+
		"Either way a ratio above 1 means fieldgate is better.")
}

func (s brokerSummary) targets() []verdict {
	tp := s.scenariosWith("qos")
	idle := s.scenariosWith("idle-")
	return []verdict{
		s.ratioTarget(fmt.Sprintf("throughput ≥ %s× mochi, every throughput scenario", constant(targets.ThroughputVsMochi)),
			tp, "mochi", "msgs/s", true, targets.ThroughputVsMochi),
		s.ratioTarget(fmt.Sprintf("throughput ≥ %s× Mosquitto, every throughput scenario", constant(targets.ThroughputVsMosquitto)),
			tp, "mosquitto", "msgs/s", true, targets.ThroughputVsMosquitto),
		s.ratioTarget(fmt.Sprintf("RSS per idle connection ≤ 1/%s of mochi's", constant(targets.IdleRSSVsMochi)),
			idle, "mochi", "rss-B/conn", false, targets.IdleRSSVsMochi),
		s.limitTarget(fmt.Sprintf("RSS per idle connection ≤ %d KiB", targets.MaxIdleRSS>>10), idle, "rss-B/conn", targets.MaxIdleRSS),
	}
}

func (s brokerSummary) body(w *markdown) {
	writeTargets(w, "Targets", s.targets())
	s.throughputTable(w)
	s.latencyTable(w)
	s.memoryTable(w)
	s.writeProblems(w)
}

func (s brokerSummary) throughputTable(w *markdown) {
	scs := s.scenariosWith("qos")
	if len(scs) == 0 {
		return
	}
	w.heading(2, "Throughput: messages received by all subscribers per second")
	w.para("`qos0-10x10`: QoS 0, 10 publishers each to its own subscriber; `1x1000`: one publisher, " +
		"1,000 subscribers of its topic. Publishers send as fast as the broker takes messages, QoS 1 ones " +
		"with a window of unacknowledged messages.")
	s.scenarioTable(w, scs, "msgs/s", ours+" ÷ %s")
	w.para("Messages delivered per message sent, in % of the subscribers that should get it: " +
		"below 100, the broker dropped QoS 0 messages. Approximate, since messages are in flight at both ends " +
		"of the interval; n/a for QoS 0 fan-out, where the messages buffered between publisher and broker " +
		"outnumber those published while measuring.")
	s.scenarioTable(w, scs, "delivered-%", "")
}

func (s brokerSummary) latencyTable(w *markdown) {
	scs := s.scenariosWith("latency-")
	if len(scs) == 0 {
		return
	}
	w.heading(2, "Latency at a fixed rate, µs")
	w.para("`latency-qos0-10x10-1000mps`: 10 publishers, each to its own subscriber, 1,000 messages per second " +
		"in total; from the publisher's write to the subscriber's read.")
	var rows [][]string
	for _, sc := range scs {
		for i, q := range []string{"p50", "p90", "p99", "max"} {
			name := ""
			if i == 0 {
				name = "`" + sc + "`"
			}
			rows = append(rows, s.row(sc, q+"-us", true, false, name, q))
		}
	}
	align, head := s.head("%s ÷ "+ours, "scenario", "")
	w.table(align, head, rows...)
}

func (s brokerSummary) memoryTable(w *markdown) {
	var scs []string
	scs = append(scs, s.scenariosWith("idle-")...)
	scs = append(scs, s.scenariosWith("subs-")...)
	if len(scs) == 0 {
		return
	}
	w.heading(2, "Memory: broker process after minus before")
	w.para("`idle-Nconns-5subs`: N idle connections with 5 subscriptions each, per connection; " +
		"`subs-Cconns-Ssubs`: S distinct subscriptions (15% with wildcards) over C connections, per subscription. " +
		"Each on a freshly started broker. RSS is VmRSS from /proc; heap is what the broker publishes under $SYS " +
		"(fieldgate and Mosquitto: `$SYS/broker/heap/current`, mochi: `$SYS/broker/system/memory`, the Go heap in use), " +
		"n/a when it publishes none.")
	var rows [][]string
	for _, sc := range scs {
		per := "conn"
		if strings.HasPrefix(sc, "subs-") {
			per = "sub"
		}
		rows = append(rows,
			s.row(sc, "rss-B/"+per, true, false, "`"+sc+"`", "RSS B/"+per),
			s.row(sc, "heap-B/"+per, true, false, "", "heap B/"+per),
			s.row(sc, "rss-MiB", true, false, "", "RSS MiB, total"))
	}
	align, head := s.head("%s ÷ "+ours, "scenario", "figure")
	w.table(align, head, rows...)
}
