package brokerbench

import (
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// minDrainVsMosquitto is the bridge target: fieldgate's drain rate ÷
// Mosquitto's bridge's, medians of the unpaced drain runs.
const minDrainVsMosquitto = 2.0

// upstreamName is the broker name of the calibration runs, in which the
// load generator publishes straight to the upstream.
const upstreamName = "upstream"

var (
	pacedRE = regexp.MustCompile(`^drain-rate(\d+)$`)
	lateRE  = regexp.MustCompile(`^crash-after(\d+)s$`)
)

// WriteBridgeMarkdown renders the bridge scenarios (bench-bridge.sh): the
// outage, the drain, the paced drain, the crash, the target and what each
// broker's acknowledgement promises.
func (s *Summary) WriteBridgeMarkdown(w io.Writer) error {
	var b strings.Builder
	cols := s.bridgeBrokers()
	s.bridgeHeader(&b)
	s.bridgeTargets(&b, cols)
	bridgeCaveats(&b, s.meta)
	s.outageTable(&b, cols)
	s.drainTable(&b, cols)
	s.pacedTable(&b)
	s.crashTable(&b, cols)
	s.problems(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

// bridgeBrokers are the brokers under test, fieldgate first: every broker
// but the upstream of the calibration runs.
func (s *Summary) bridgeBrokers() []string {
	return slices.DeleteFunc(slices.Clone(s.brokers), func(b string) bool { return b == upstreamName })
}

func (s *Summary) bridgeHeader(b *strings.Builder) {
	m := s.meta
	inflight := orUnknown(m["inflight"])
	s.writeHeader(b, "Bridging through an outage: fieldgate vs Mosquitto's bridge",
		"one broker under test at a time, started afresh with new state for every run, beside the upstream Mosquitto",
		fmt.Sprintf("Go: %s", orUnknown(m["go"])),
		fmt.Sprintf("fieldgate: %s: its bridge and durable outbox (bbolt); one out-route `bench/#` at QoS 1, `rate: 0` "+
			"(unpaced%s), `max_inflight: %s`, reconnect backoff 1 s to 2 s, "+
			"`max_outbox_bytes` 1 GiB (nothing dropped), protocol auto (MQTT 5 with this upstream)",
			orUnknown(m["fieldgate"]), pacedNote(m["paced-rate"]), inflight),
		fmt.Sprintf("Mosquitto: %s, `persistence true`, `autosave_interval %s`, `max_queued_messages 0` (no limit), "+
			"`max_inflight_messages %s`; its bridge: `topic bench/# out 1`, `cleansession false`, `restart_timeout 1 2` "+
			"(backoff from 1 s to 2 s), `notifications false`, MQTT 3.1.1 (its default)",
			orUnknown(m["mosquitto"]), orUnknown(m["mosquitto-autosave"]), inflight),
		"Upstream: the same Mosquitto on a port of its own, `persistence true`, `max_queued_messages 0`, "+
			"`max_inflight_messages 0`. One persistent session on it (clean session 0, QoS 1, `bench/#`) counts what "+
			"arrives; it is connected throughout but for the outage and back in its session within 20 ms of the "+
			"upstream's return, which keeps for it anything that comes before.",
		fmt.Sprintf("State files: %s", orUnknown(m["disk"])),
	)
	fmt.Fprintln(b)
}

// bridgeTargets judges the drain target and whether fieldgate delivered
// every acknowledged message, then says plainly whether the target is met.
func (s *Summary) bridgeTargets(b *strings.Builder, cols []string) {
	section(b, "Target", "")
	fmt.Fprintln(b, "| target | result |")
	fmt.Fprintln(b, "|---|---|")
	name := fmt.Sprintf("drain ≥ %s× Mosquitto's bridge (messages per second from the first to the last message upstream)",
		fmtConst(minDrainVsMosquitto))
	fg, mq := s.get("drain", ours, "msgs/s"), s.get("drain", "mosquitto", "msgs/s")
	met := false
	var result string
	switch {
	case !fg.ok:
		result = s.notMeasured([]string{"drain"}, ours)
	case !mq.ok || mq.v <= 0:
		result = s.notMeasured([]string{"drain"}, "mosquitto")
	default:
		r := fg.v / mq.v
		met = r >= minDrainVsMosquitto
		txt := fmt.Sprintf("%s (fieldgate %s msgs/s, Mosquitto %s)", fmtRatio(r), fmtNum(fg.v), fmtNum(mq.v))
		if met {
			result = "✓ " + txt
		} else {
			result = "**✗ " + txt + "**"
		}
	}
	fmt.Fprintf(b, "| %s | %s |\n", name, result)
	n := s.meta["n"]
	for _, sc := range []struct{ scenario, what string }{
		{"drain", "after the outage"},
		{"crash", "after SIGKILL right after the last PUBACK"},
	} {
		fmt.Fprintf(b, "| fieldgate delivers all %s acknowledged messages %s, every run | %s |\n",
			orUnknown(groupDigits(n)), sc.what, s.allDelivered(sc.scenario, ours))
	}
	fmt.Fprintln(b)

	switch {
	case !fg.ok || !mq.ok || mq.v <= 0:
		paragraph(b, "**Whether the target is met cannot be said: a drain figure is missing.**")
		return
	case met:
		paragraph(b, fmt.Sprintf("**The target is met**: fieldgate's bridge drained the backlog %s as fast as Mosquitto's.",
			fmtRatio(fg.v/mq.v)))
	default:
		paragraph(b, fmt.Sprintf("**The target is not met**: fieldgate's bridge drained the backlog at %s× the rate of Mosquitto's "+
			"(%s against %s messages a second).", strconv.FormatFloat(fg.v/mq.v, 'f', 2, 64), fmtNum(fg.v), fmtNum(mq.v)))
	}
	ft, mt := s.get("drain", ours, "total-s"), s.get("drain", "mosquitto", "total-s")
	fw, mw := s.get("drain", ours, "wait-s"), s.get("drain", "mosquitto", "wait-s")
	if ft.ok && mt.ok && fw.ok && mw.ok {
		paragraph(b, fmt.Sprintf("Counted from the upstream's return instead, fieldgate had delivered the backlog after %s s and "+
			"Mosquitto after %s s: fieldgate's bridge was back sooner (its first message after %s s, Mosquitto's after %s s; "+
			"both back off from 1 s to 2 s after the link drops, but fieldgate draws each delay from 0.1 s up, "+
			"Mosquitto from 1 s up), "+
			"which the drain rate leaves out.",
			fmtNum(ft.v), fmtNum(mt.v), fmtNum(fw.v), fmtNum(mw.v)))
	}
	// The upstream is one thread: its CPU time per message in Mosquitto's
	// drain bounds what any bridge can drain into it.
	if u := s.get("drain", "mosquitto", "upstream-cpu-%"); u.ok && u.v > 0 && mq.v > 0 {
		perMsg := u.v / 100 / mq.v // seconds of upstream CPU per message
		most := 1 / perMsg
		txt := fmt.Sprintf("During Mosquitto's drain the upstream, a single-threaded Mosquitto, was busy %s of the time: "+
			"%s µs of CPU per message, so even with a whole core to itself it would pass at most about %s messages a second.",
			pct(u.v/100), strconv.FormatFloat(perMsg*1e6, 'f', 1, 64), fmtNum(most))
		if !met && most < minDrainVsMosquitto*mq.v {
			txt += fmt.Sprintf(" Draining %s× as fast as Mosquitto's bridge (%s a second) is more than this upstream can take "+
				"on this machine, whatever the bridge: the target cannot be shown with this setup.",
				fmtConst(minDrainVsMosquitto), fmtNum(minDrainVsMosquitto*mq.v))
		}
		paragraph(b, txt)
	}
}

// allDelivered checks that broker delivered every message in every run of
// scenario, listing the runs.
func (s *Summary) allDelivered(scenario, broker string) string {
	vs := s.values[cell{scenario, broker, "delivered-%"}]
	if len(vs) == 0 {
		return s.notMeasured([]string{scenario}, broker)
	}
	short := 0
	for _, v := range vs {
		if v < 100 {
			short++
		}
	}
	runs := s.runListFormat(scenario, broker, "delivered", fmtCount)
	if short > 0 {
		return fmt.Sprintf("**✗ %d of %d runs fell short: delivered %s**", short, len(vs), runs)
	}
	return fmt.Sprintf("✓ %d of %d runs (delivered %s)", len(vs), len(vs), runs)
}

// runList is every run's value of one figure, in run order.
func (s *Summary) runList(scenario, broker, unit string) string {
	return s.runListFormat(scenario, broker, unit, fmtNum)
}

func (s *Summary) runListFormat(scenario, broker, unit string, format func(float64) string) string {
	vs := s.values[cell{scenario, broker, unit}]
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = format(v)
	}
	return strings.Join(out, ", ")
}

// fmtCount formats a number of messages: 100,000, 0.
func fmtCount(v float64) string {
	return groupThousands(strconv.FormatFloat(math.Round(v), 'f', 0, 64))
}

func bridgeCaveats(b *strings.Builder, meta map[string]string) {
	section(b, "What a PUBACK means here", "")
	autosave := orUnknown(meta["mosquitto-autosave"])
	for _, c := range []string{
		"**fieldgate** acknowledges a QoS 1 PUBLISH once its outbox entry is fsynced (group commit: the publishers share " +
			"commits). An entry is deleted after the upstream's PUBACK, lazily (without waiting for an fsync), so a crash may " +
			"send a message twice, never lose it.",
		"**Mosquitto** acknowledges from memory. With `persistence true` it writes its whole state, bridge queue included, " +
			"to `persistence_location` every `autosave_interval` (here " + autosave + " s; 2.0.11 saves once more than the " +
			"interval has passed in whole seconds, so every 2 s in practice) and when it stops; a crash loses every message " +
			"since the last save. Its default interval is 1,800 s. Each save rewrites the whole state, so its disk bytes per " +
			"message depend on how many saves fall inside the outage, not on the messages.",
		"The **crash** runs SIGKILL the broker under test right after the last PUBACK, restart it on the same state, and " +
			"then start the upstream; the **crash-after** runs wait a few seconds first, long enough for an autosave. " +
			"Whether a save falls inside a burst of a second or two decides Mosquitto's crash figure.",
	} {
		fmt.Fprintf(b, "- %s\n", c)
	}
	fmt.Fprintln(b)
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
func (s *Summary) bridgeTable(b *strings.Builder, cols []string, rows []bridgeRow) {
	head := append([]string{"figure"}, cols...)
	var peers []string
	for _, c := range cols {
		if c != ours {
			peers = append(peers, c)
			head = append(head, ours+" ÷ "+c)
		}
	}
	fmt.Fprintf(b, "| %s |\n|---|", strings.Join(head, " | "))
	for range head[1:] {
		b.WriteString("--:|")
	}
	b.WriteByte('\n')
	for _, r := range rows {
		cells := []string{r.label}
		format := fmtNum
		if r.count {
			format = fmtCount
		}
		for _, c := range cols {
			v := s.value(r.scenario, c, r.unit)
			f := s.get(r.scenario, c, r.unit)
			if f.ok {
				v = format(f.v)
			}
			if r.runs && f.n > 1 {
				v += " (" + s.runListFormat(r.scenario, c, r.unit, format) + ")"
			}
			cells = append(cells, v)
		}
		for _, p := range peers {
			cells = append(cells, s.ratioCell(r.scenario, p, r.unit, true))
		}
		fmt.Fprintf(b, "| %s |\n", strings.Join(cells, " | "))
	}
	fmt.Fprintln(b)
}

func (s *Summary) outageTable(b *strings.Builder, cols []string) {
	if !slices.Contains(s.scenarios, "outage") {
		return
	}
	section(b, "Outage: publishing locally while the upstream is down",
		fmt.Sprintf("The upstream is stopped; %s publishers send %s numbered QoS 1 messages of %s to the broker under test "+
			"as fast as it acknowledges them (each with a window of %s), all on bridged topics, so every one is queued "+
			"for the upstream. Disk bytes: the growth of `write_bytes` in /proc/PID/io from the first PUBLISH to the last "+
			"PUBACK, per message. One publisher: a single connection publishing for 1 s right after, the upstream "+
			"still down (the baseline of the live publisher below). Ratios are fieldgate ÷ Mosquitto.",
			orUnknown(s.metaSetting("PUBS")), orUnknown(groupDigits(s.meta["n"])), orUnknown(s.metaSetting("PAYLOAD")+" B"),
			orUnknown(s.metaSetting("WINDOW"))))
	s.bridgeTable(b, cols, []bridgeRow{
		{label: "PUBACKs/s", scenario: "outage", unit: "acks/s"},
		{label: "disk bytes per queued message", scenario: "outage", unit: "disk-B/msg", runs: true},
		{label: "disk MiB written in the outage", scenario: "outage", unit: "disk-MiB"},
		{label: "seconds to publish them all", scenario: "outage", unit: "publish-s"},
		{label: "PUBACKs/s, one publisher", scenario: "live-outage", unit: "acks/s"},
	})
}

func (s *Summary) drainTable(b *strings.Builder, cols []string) {
	if !slices.Contains(s.scenarios, "drain") {
		return
	}
	section(b, "Drain: the backlog reaching the upstream",
		"The upstream starts again. Drain: from the first of the messages reaching the counting session to the last "+
			"(every one counted by its number), and messages per second over that time. Wait: from the upstream's return "+
			"to the first message (the bridge noticing and reconnecting). While the drain runs, one more publisher sends "+
			"to the broker under test as fast as it acknowledges (window as above): its PUBACKs per second, to compare "+
			"with the one publisher of the outage table. CPU: user and system time from /proc/PID/stat over the drain (the broker "+
			"under test's includes serving that publisher). Duplicates: messages that arrived twice.")
	s.bridgeTable(b, cols, []bridgeRow{
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
			"counting session (runs: %s)", orUnknown(groupDigits(s.meta["n"])), orUnknown(s.meta["inflight"]), fmtNum(d.v),
			s.runList("direct", upstreamName, "msgs/s"))
		if u := s.get("direct", upstreamName, "upstream-cpu-%"); u.ok {
			txt += fmt.Sprintf(", the upstream busy %s of the time", pct(u.v/100))
		}
		paragraph(b, txt+". On two cores the sender's own CPU time competes with the upstream's, so this is no ceiling.")
	}
}

func (s *Summary) pacedTable(b *strings.Builder) {
	var sc, rate string
	for _, name := range s.scenarios {
		if m := pacedRE.FindStringSubmatch(name); m != nil && s.ran(name, ours) {
			sc, rate = name, m[1]
		}
	}
	if sc == "" {
		return
	}
	section(b, "Pacing: fieldgate at its default rate",
		fmt.Sprintf("The same outage with fieldgate's bridge at `rate: %s`, its default, which paces a backlog so that it "+
			"neither floods the upstream nor starves the gateway (no live publisher: it would pile up minutes of messages). "+
			"Runs: %d.", rate, s.get(sc, ours, "msgs/s").n))
	fmt.Fprintln(b, "| figure | fieldgate |")
	fmt.Fprintln(b, "|---|--:|")
	for _, r := range []bridgeRow{
		{label: "drain, messages/s", unit: "msgs/s"},
		{label: "drain, s", unit: "drain-s"},
		{label: "upstream's return to the last message, s", unit: "total-s"},
		{label: "delivered, %", unit: "delivered-%"},
		{label: "duplicates", unit: "dups", count: true},
	} {
		v := s.value(sc, ours, r.unit)
		if f := s.get(sc, ours, r.unit); f.ok && r.count {
			v = fmtCount(f.v)
		}
		fmt.Fprintf(b, "| %s | %s |\n", r.label, v)
	}
	fmt.Fprintln(b)
}

func (s *Summary) crashTable(b *strings.Builder, cols []string) {
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
	section(b, "Crash: SIGKILL during the outage",
		fmt.Sprintf("After the last of the %s messages is acknowledged, the broker under test is killed with SIGKILL "+
			"(`crash`: at once; `crash-afterNs`: N seconds later), started again on the same state, and the upstream "+
			"started: how many of the acknowledged messages reach the counting session (the count ends %s after the last "+
			"new one, or after the upstream's return if none comes). Every run's figure in brackets.",
			orUnknown(groupDigits(s.meta["n"])), orUnknown(s.metaSetting("IDLE"))))
	var rows []bridgeRow
	for _, sc := range scs {
		rows = append(rows,
			bridgeRow{label: "`" + sc + "`: delivered", scenario: sc, unit: "delivered", runs: true, count: true},
			bridgeRow{label: "`" + sc + "`: delivered, %", scenario: sc, unit: "delivered-%"},
			bridgeRow{label: "`" + sc + "`: duplicates", scenario: sc, unit: "dups", runs: true, count: true},
			bridgeRow{label: "`" + sc + "`: upstream's return to the last message, s", scenario: sc, unit: "total-s"},
		)
	}
	s.bridgeTable(b, cols, rows)
}

// metaSetting is one KEY=VALUE of the settings line.
func (s *Summary) metaSetting(key string) string {
	for f := range strings.FieldsSeq(s.meta["settings"]) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}

func pct(r float64) string { return strconv.FormatFloat(100*r, 'f', 0, 64) + "%" }

// groupDigits formats a count such as "100000" as "100,000"; anything
// else is returned as it is.
func groupDigits(n string) string {
	if _, err := strconv.Atoi(n); err != nil {
		return n
	}
	return groupThousands(n)
}

// pacedNote mentions the paced run when there was one: PACED_RATE=0 skips
// it.
func pacedNote(rate string) string {
	if rate == "0" {
		return ""
	}
	return fmt.Sprintf("; one more run at `rate: %s`", orUnknown(rate))
}
