package report

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"

	"github.com/fieldgate/fieldgate/scripts/bench/targets"
)

// upstreamName is the broker name of the calibration runs, in which the
// load generator publishes straight to the upstream (bench-bridge.sh's
// run_direct).
const upstreamName = "upstream"

var (
	pacedRE = regexp.MustCompile(`^drain-rate(\d+)$`)
	lateRE  = regexp.MustCompile(`^crash-after(\d+)s$`)
)

// bridgeSummary is the bridge comparison (bench-bridge.sh): the outage,
// the drain, the paced drain and the crash of fieldgate's bridge and
// Mosquitto's.
type bridgeSummary struct{ *brokerRuns }

func (s bridgeSummary) title() string {
	return "Bridging through an outage: fieldgate vs Mosquitto's bridge"
}

// cols are the brokers under test, fieldgate first: every broker but the
// upstream of the calibration runs.
func (s bridgeSummary) cols() []string {
	return slices.DeleteFunc(slices.Clone(s.brokers), func(b string) bool { return b == upstreamName })
}

func (s bridgeSummary) intro(w *markdown) {
	m := s.meta
	inflight := orUnknown(m.get("inflight"))
	s.writeHeader(w, "one broker under test at a time, started afresh with new state for every run, beside the upstream Mosquitto", []string{
		fmt.Sprintf("Go: %s", orUnknown(m.get("go"))),
		fmt.Sprintf("fieldgate: %s: its bridge and durable outbox (bbolt); one out-route `bench/#` at QoS 1, `rate: 0` "+
			"(unpaced%s), `max_inflight: %s`, reconnect backoff 1 s to 2 s, "+
			"`max_outbox_bytes` 1 GiB (nothing dropped), protocol auto (MQTT 5 with this upstream)",
			orUnknown(m.get("fieldgate")), pacedNote(m.get("paced-rate")), inflight),
		fmt.Sprintf("Mosquitto: %s, `persistence true`, `autosave_interval %s`, `max_queued_messages 0` (no limit), "+
			"`max_inflight_messages %s`; its bridge: `topic bench/# out 1`, `cleansession false`, `restart_timeout 1 2` "+
			"(backoff from 1 s to 2 s), `notifications false`, MQTT 3.1.1 (its default)",
			orUnknown(m.get("mosquitto")), orUnknown(m.get("mosquitto-autosave")), inflight),
		"Upstream: the same Mosquitto on a port of its own, `persistence true`, `max_queued_messages 0`, " +
			"`max_inflight_messages 0`. One persistent session on it (clean session 0, QoS 1, `bench/#`) counts what " +
			"arrives; it is connected throughout but for the outage and back in its session within 20 ms of the " +
			"upstream's return, which keeps for it anything that comes before.",
		fmt.Sprintf("State files: %s", orUnknown(m.get("disk"))),
	})
}

func (s bridgeSummary) body(w *markdown) {
	cols := s.cols()
	s.writeTarget(w)
	bridgeCaveats(w, s.meta)
	s.outageTable(w, cols)
	s.drainTable(w, cols)
	s.pacedTable(w)
	s.crashTable(w, cols)
	s.writeProblems(w)
}

// drainRatio is fieldgate's drain rate ÷ Mosquitto's bridge's; ok is
// false when either is missing.
func (s bridgeSummary) drainRatio() (r float64, fg, mq fig, ok bool) {
	fg, mq = s.get("drain", ours, "msgs/s"), s.get("drain", "mosquitto", "msgs/s")
	if !fg.ok || !mq.ok || mq.v <= 0 {
		return 0, fg, mq, false
	}
	return fg.v / mq.v, fg, mq, true
}

func (s bridgeSummary) targets() []verdict {
	name := fmt.Sprintf("drain ≥ %s× Mosquitto's bridge (messages per second from the first to the last message upstream)",
		constant(targets.DrainVsMosquitto))
	var drain verdict
	r, fg, mq, ok := s.drainRatio()
	switch {
	case !fg.ok:
		drain = notJudged(name, s.notMeasured([]string{"drain"}, ours))
	case !ok:
		drain = notJudged(name, s.notMeasured([]string{"drain"}, "mosquitto"))
	default:
		drain = judged(name, r >= targets.DrainVsMosquitto,
			fmt.Sprintf("%s (fieldgate %s msgs/s, Mosquitto %s)", ratio(r), figure(fg.v), figure(mq.v)))
	}
	vs := []verdict{drain}
	n := orUnknown(groupDigits(s.meta.get("n")))
	for _, sc := range []struct{ scenario, what string }{
		{"drain", "after the outage"},
		{"crash", "after SIGKILL right after the last PUBACK"},
	} {
		vs = append(vs, s.allDelivered(fmt.Sprintf("fieldgate delivers all %s acknowledged messages %s, every run", n, sc.what),
			sc.scenario, ours))
	}
	return vs
}

// writeTarget judges the drain target and whether fieldgate delivered
// every acknowledged message, then says plainly whether the target is met.
func (s bridgeSummary) writeTarget(w *markdown) {
	writeTargets(w, "Target", s.targets())
	r, fg, mq, ok := s.drainRatio()
	switch {
	case !ok:
		w.para("**Whether the target is met cannot be said: a drain figure is missing.**")
		return
	case r >= targets.DrainVsMosquitto:
		w.para(fmt.Sprintf("**The target is met**: fieldgate's bridge drained the backlog %s as fast as Mosquitto's.", ratio(r)))
	default:
		w.para(fmt.Sprintf("**The target is not met**: fieldgate's bridge drained the backlog at %s× the rate of Mosquitto's "+
			"(%s against %s messages a second).", strconv.FormatFloat(r, 'f', 2, 64), figure(fg.v), figure(mq.v)))
	}
	ft, mt := s.get("drain", ours, "total-s"), s.get("drain", "mosquitto", "total-s")
	fw, mw := s.get("drain", ours, "wait-s"), s.get("drain", "mosquitto", "wait-s")
	if ft.ok && mt.ok && fw.ok && mw.ok {
		w.para(fmt.Sprintf("Counted from the upstream's return instead, fieldgate had delivered the backlog after %s s and "+
			"Mosquitto after %s s: fieldgate's bridge was back sooner (its first message after %s s, Mosquitto's after %s s; "+
			"both back off from 1 s to 2 s after the link drops, but fieldgate draws each delay from 0.1 s up, "+
			"Mosquitto from 1 s up), "+
			"which the drain rate leaves out.",
			figure(ft.v), figure(mt.v), figure(fw.v), figure(mw.v)))
	}
	// The upstream is one thread: its CPU time per message in Mosquitto's
	// drain bounds what any bridge can drain into it.
	if u := s.get("drain", "mosquitto", "upstream-cpu-%"); u.ok && u.v > 0 && mq.v > 0 {
		perMsg := u.v / 100 / mq.v // seconds of upstream CPU per message
		most := 1 / perMsg
		txt := fmt.Sprintf("During Mosquitto's drain the upstream, a single-threaded Mosquitto, was busy %s of the time: "+
			"%s µs of CPU per message, so even with a whole core to itself it would pass at most about %s messages a second.",
			pct(u.v/100), strconv.FormatFloat(perMsg*1e6, 'f', 1, 64), figure(most))
		if r < targets.DrainVsMosquitto && most < targets.DrainVsMosquitto*mq.v {
			txt += fmt.Sprintf(" Draining %s× as fast as Mosquitto's bridge (%s a second) is more than this upstream can take "+
				"on this machine, whatever the bridge: the target cannot be shown with this setup.",
				constant(targets.DrainVsMosquitto), figure(targets.DrainVsMosquitto*mq.v))
		}
		w.para(txt)
	}
}

// allDelivered judges whether broker delivered every message in every run
// of scenario, listing the runs.
func (s bridgeSummary) allDelivered(name, scenario, broker string) verdict {
	vs := s.values[figKey{scenario, broker, "delivered-%"}]
	if len(vs) == 0 {
		return notJudged(name, s.notMeasured([]string{scenario}, broker))
	}
	short := 0
	for _, v := range vs {
		if v < targets.MinDeliveredPct {
			short++
		}
	}
	runs := s.runList(scenario, broker, "delivered", thousands)
	if short > 0 {
		return judged(name, false, fmt.Sprintf("%d of %d runs fell short: delivered %s", short, len(vs), runs))
	}
	return judged(name, true, fmt.Sprintf("%d of %d runs (delivered %s)", len(vs), len(vs), runs))
}

func bridgeCaveats(w *markdown, m meta) {
	w.heading(2, "What a PUBACK means here")
	autosave := orUnknown(m.get("mosquitto-autosave"))
	w.list(
		"**fieldgate** acknowledges a QoS 1 PUBLISH once its outbox entry is fsynced (group commit: the publishers share "+
			"commits). An entry is deleted after the upstream's PUBACK, lazily (without waiting for an fsync), so a crash may "+
			"send a message twice, never lose it.",
		"**Mosquitto** acknowledges from memory. With `persistence true` it writes its whole state, bridge queue included, "+
			"to `persistence_location` every `autosave_interval` (here "+autosave+" s; 2.0.11 saves once more than the "+
			"interval has passed in whole seconds, so every 2 s in practice) and when it stops; a crash loses every message "+
			"since the last save. Its default interval is 1,800 s. Each save rewrites the whole state, so its disk bytes per "+
			"message depend on how many saves fall inside the outage, not on the messages.",
		"The **crash** runs SIGKILL the broker under test right after the last PUBACK, restart it on the same state, and "+
			"then start the upstream; the **crash-after** runs wait a few seconds first, long enough for an autosave. "+
			"Whether a save falls inside a burst of a second or two decides Mosquitto's crash figure.",
	)
}

// bridgeRow is one row of a bridge table: a label and the scenario and
// unit of its figures.
type bridgeRow struct {
	label, scenario, unit string
	runs                  bool // show every run's value beside the median
	count                 bool // a whole number of messages
}

// bridgeTable writes rows with a column per broker in cols and, for each
// peer, the ratio fieldgate ÷ peer.
func (s bridgeSummary) bridgeTable(w *markdown, cols []string, rows []bridgeRow) {
	head := append([]string{"figure"}, cols...)
	var peers []string
	for _, c := range cols {
		if c != ours {
			peers = append(peers, c)
			head = append(head, ours+" ÷ "+c)
		}
	}
	var out [][]string
	for _, r := range rows {
		cells := []string{r.label}
		format := figure
		if r.count {
			format = thousands
		}
		for _, c := range cols {
			v := s.value(r.scenario, c, r.unit, format)
			if f := s.get(r.scenario, c, r.unit); r.runs && f.n > 1 {
				v += " (" + s.runList(r.scenario, c, r.unit, format) + ")"
			}
			cells = append(cells, v)
		}
		for _, p := range peers {
			cells = append(cells, s.ratioCell(r.scenario, p, r.unit, true))
		}
		out = append(out, cells)
	}
	w.table("l", head, out...)
}

func (s bridgeSummary) outageTable(w *markdown, cols []string) {
	if !slices.Contains(s.scenarios, "outage") {
		return
	}
	w.heading(2, "Outage: publishing locally while the upstream is down")
	w.para(fmt.Sprintf("The upstream is stopped; %s publishers send %s numbered QoS 1 messages of %s to the broker under test "+
		"as fast as it acknowledges them (each with a window of %s), all on bridged topics, so every one is queued "+
		"for the upstream. Disk bytes: the growth of `write_bytes` in /proc/PID/io from the first PUBLISH to the last "+
		"PUBACK, per message. One publisher: a single connection publishing for 1 s right after, the upstream "+
		"still down (the baseline of the live publisher below). Ratios are fieldgate ÷ Mosquitto.",
		orUnknown(s.setting("PUBS")), orUnknown(groupDigits(s.meta.get("n"))), orUnknown(s.setting("PAYLOAD")+" B"),
		orUnknown(s.setting("WINDOW"))))
	s.bridgeTable(w, cols, []bridgeRow{
		{label: "PUBACKs/s", scenario: "outage", unit: "acks/s"},
		{label: "disk bytes per queued message", scenario: "outage", unit: "disk-B/msg", runs: true},
		{label: "disk MiB written in the outage", scenario: "outage", unit: "disk-MiB"},
		{label: "seconds to publish them all", scenario: "outage", unit: "publish-s"},
		{label: "PUBACKs/s, one publisher", scenario: "live-outage", unit: "acks/s"},
	})
}

func (s bridgeSummary) drainTable(w *markdown, cols []string) {
	if !slices.Contains(s.scenarios, "drain") {
		return
	}
	w.heading(2, "Drain: the backlog reaching the upstream")
	w.para("The upstream starts again. Drain: from the first of the messages reaching the counting session to the last " +
		"(every one counted by its number), and messages per second over that time. Wait: from the upstream's return " +
		"to the first message (the bridge noticing and reconnecting). While the drain runs, one more publisher sends " +
		"to the broker under test as fast as it acknowledges (window as above): its PUBACKs per second, to compare " +
		"with the one publisher of the outage table. CPU: user and system time from /proc/PID/stat over the drain (the broker " +
		"under test's includes serving that publisher). Duplicates: messages that arrived twice.")
	s.bridgeTable(w, cols, []bridgeRow{
		{label: "drain, messages/s", scenario: "drain", unit: "msgs/s", runs: true},
		{label: "drain, s", scenario: "drain", unit: "drain-s"},
		{label: "wait for the first message, s", scenario: "drain", unit: "wait-s"},
		{label: "upstream's return to the last message, s", scenario: "drain", unit: "total-s"},
		{label: "one publisher's PUBACKs/s during the drain", scenario: "drain", unit: "live-acks/s"},
		{label: "upstream CPU during the drain, % of a core", scenario: "drain", unit: "upstream-cpu-%"},
		{label: "broker under test CPU during the drain, % of a core", scenario: "drain", unit: "broker-cpu-%"},
		{label: "delivered, %", scenario: "drain", unit: "delivered-%"},
		{label: "duplicates", scenario: "drain", unit: "dups", runs: true, count: true},
	})
	if d := s.get("direct", upstreamName, "msgs/s"); d.ok {
		txt := fmt.Sprintf("For reference, the load generator's own client publishing the same %s numbered messages straight "+
			"to a fresh upstream over one connection with the bridges' window (%s) got %s messages a second through to the "+
			"counting session (runs: %s)", orUnknown(groupDigits(s.meta.get("n"))), orUnknown(s.meta.get("inflight")), figure(d.v),
			s.runList("direct", upstreamName, "msgs/s", figure))
		if u := s.get("direct", upstreamName, "upstream-cpu-%"); u.ok {
			txt += fmt.Sprintf(", the upstream busy %s of the time", pct(u.v/100))
		}
		w.para(txt + ". On two cores the sender's own CPU time competes with the upstream's, so this is no ceiling.")
	}
}

func (s bridgeSummary) pacedTable(w *markdown) {
	var sc, rate string
	for _, name := range s.scenarios {
		if m := pacedRE.FindStringSubmatch(name); m != nil && s.ran(name, ours) {
			sc, rate = name, m[1]
		}
	}
	if sc == "" {
		return
	}
	w.heading(2, "Pacing: fieldgate at its default rate")
	w.para(fmt.Sprintf("The same outage with fieldgate's bridge at `rate: %s`, its default, which paces a backlog so that it "+
		"neither floods the upstream nor starves the gateway (no live publisher: it would pile up minutes of messages). "+
		"Runs: %d.", rate, s.get(sc, ours, "msgs/s").n))
	var rows [][]string
	for _, r := range []bridgeRow{
		{label: "drain, messages/s", unit: "msgs/s"},
		{label: "drain, s", unit: "drain-s"},
		{label: "upstream's return to the last message, s", unit: "total-s"},
		{label: "delivered, %", unit: "delivered-%"},
		{label: "duplicates", unit: "dups", count: true},
	} {
		format := figure
		if r.count {
			format = thousands
		}
		rows = append(rows, []string{r.label, s.value(sc, ours, r.unit, format)})
	}
	w.table("l", []string{"figure", "fieldgate"}, rows...)
}

func (s bridgeSummary) crashTable(w *markdown, cols []string) {
	scs := []string{}
	if slices.Contains(s.scenarios, "crash") {
		scs = append(scs, "crash")
	}
	for _, name := range s.scenarios {
		if lateRE.MatchString(name) {
			scs = append(scs, name)
		}
	}
	if len(scs) == 0 {
		return
	}
	w.heading(2, "Crash: SIGKILL during the outage")
	w.para(fmt.Sprintf("After the last of the %s messages is acknowledged, the broker under test is killed with SIGKILL "+
		"(`crash`: at once; `crash-afterNs`: N seconds later), started again on the same state, and the upstream "+
		"started: how many of the acknowledged messages reach the counting session (the count ends %s after the last "+
		"new one, or after the upstream's return if none comes). Every run's figure in brackets.",
		orUnknown(groupDigits(s.meta.get("n"))), orUnknown(s.setting("IDLE"))))
	var rows []bridgeRow
	for _, sc := range scs {
		rows = append(rows,
			bridgeRow{label: "`" + sc + "`: delivered", scenario: sc, unit: "delivered", runs: true, count: true},
			bridgeRow{label: "`" + sc + "`: delivered, %", scenario: sc, unit: "delivered-%"},
			bridgeRow{label: "`" + sc + "`: duplicates", scenario: sc, unit: "dups", runs: true, count: true},
			bridgeRow{label: "`" + sc + "`: upstream's return to the last message, s", scenario: sc, unit: "total-s"},
		)
	}
	s.bridgeTable(w, cols, rows)
}

// pacedNote mentions the paced run when there was one: PACED_RATE=0 skips
// it.
func pacedNote(rate string) string {
	if rate == "0" {
		return ""
	}
	return fmt.Sprintf("; one more run at `rate: %s`", orUnknown(rate))
}
