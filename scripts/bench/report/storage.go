package report

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/fieldgate/fieldgate/scripts/bench/targets"
)

// tracedSuffix ends the name of a persistence scenario's second run, made
// under strace to count the sync calls (brokerbench.PersistScenarios).
const tracedSuffix = "-traced"

var persistRE = regexp.MustCompile(`^persist-qos1-(\d+)x(\d+)$`)

// storageSummary is the persistence comparison (bench-storage.sh):
// PUBACKs per second, fsyncs and disk bytes of persisted QoS 1 publishing.
type storageSummary struct{ *brokerRuns }

func (s storageSummary) title() string {
	return "Persisted QoS 1 publishing: fieldgate vs mochi-mqtt + bolt vs Mosquitto"
}

func (s storageSummary) intro(w *markdown) {
	m := s.meta
	s.writeHeader(w, "one broker at a time, each started afresh on a new state file for every scenario", []string{
		fmt.Sprintf("State files: %s", orUnknown(m.get("disk"))),
		fmt.Sprintf("Go: %s", orUnknown(m.get("go"))),
		fmt.Sprintf("fieldgate: %s, its `storage` package (bbolt, group commit)", orUnknown(m.get("fieldgate"))),
		fmt.Sprintf("mochi-mqtt: %s, its full `Server` with the bolt storage hook (`hooks/storage/bolt`, default options) on bbolt %s",
			orUnknown(m.get("mochi")), orUnknown(m.get("bbolt"))),
		fmt.Sprintf("Mosquitto: %s, `persistence true`, `autosave_interval` left at its default, `max_queued_messages 0`", orUnknown(m.get("mosquitto"))),
		fmt.Sprintf("fsync counts: %s", orUnknown(m.get("strace"))),
	})
}

// untraced are the persistence scenarios of the runs without strace.
func (s storageSummary) untraced() []string {
	var scs []string
	for _, sc := range s.scenariosWith("persist-") {
		if !strings.HasSuffix(sc, tracedSuffix) {
			scs = append(scs, sc)
		}
	}
	return scs
}

// targets judges fieldgate at the scenario with the most publishers.
func (s storageSummary) targets() []verdict {
	sc, pubs := "", 0
	for _, name := range s.untraced() {
		if m := persistRE.FindStringSubmatch(name); m != nil {
			if n, _ := strconv.Atoi(m[1]); n > pubs {
				sc, pubs = name, n
			}
		}
	}
	at := fmt.Sprintf("at %d publishers", pubs)
	if pubs != targets.PersistPublishers && pubs != 0 {
		at += fmt.Sprintf(" (the most measured; the target is for %d)", targets.PersistPublishers)
	}
	if pubs == 0 {
		at = fmt.Sprintf("at %d publishers", targets.PersistPublishers)
	}
	var only []string
	if sc != "" {
		only = []string{sc}
	}
	return []verdict{
		s.ratioTarget(fmt.Sprintf("PUBACKs/s ≥ %s× mochi + bolt %s", constant(targets.PersistVsMochi), at),
			only, "mochi", "acks/s", true, targets.PersistVsMochi),
		s.fsyncTarget(fmt.Sprintf("fsyncs per message ≤ 1/%s %s", constant(1/targets.MaxFsyncsPerMsg), at), sc),
	}
}

// fsyncTarget judges fieldgate's sync calls per message in the traced run
// of scenario sc.
func (s storageSummary) fsyncTarget(name, sc string) verdict {
	if sc == "" {
		return notJudged(name, s.notMeasured(nil, ours))
	}
	traced := sc + tracedSuffix
	f := s.get(traced, ours, "fsyncs/msg")
	switch {
	case !f.ok && !s.ran(traced, ours):
		if s.ran(sc, ours) {
			return notJudged(name, "not measured: no run under strace ("+orUnknown(s.meta.get("strace"))+")")
		}
		return notJudged(name, s.notMeasured([]string{traced}, ours))
	case !f.ok:
		return notJudged(name, "not measured: no fsync counts in the run under strace")
	}
	txt := fmt.Sprintf("%s %s per message", sc, small(f.v))
	if f.v > 0 {
		txt += fmt.Sprintf(" (one per %s messages)", figure(1/f.v))
	}
	return judged(name, f.v <= targets.MaxFsyncsPerMsg, txt)
}

func (s storageSummary) body(w *markdown) {
	scs := s.untraced()
	writeTargets(w, "Targets", s.targets())
	storageCaveats(w)
	if len(scs) > 0 {
		w.heading(2, "Throughput: PUBACKs per second")
		w.para("`persist-qos1-100x3`: 100 publishers send QoS 1 messages of distinct topics as fast as the broker " +
			"acknowledges them, each with a window of unacknowledged messages, while 3 persistent sessions " +
			"subscribed to every topic are disconnected: every message is queued three times for sessions that are away.")
		s.scenarioTable(w, scs, "acks/s", ours+" ÷ %s")

		w.heading(2, "Disk: sync calls and bytes written")
		w.para("Disk bytes: the growth of `write_bytes` in /proc/PID/io over the measured interval (what the " +
			"kernel must write to the device for the broker; a page counts again each time it is dirtied " +
			"after a flush), per PUBACK and per second. Stored: after measuring, the publishers stop and " +
			"collect their last PUBACKs, one session reconnects and reads its queue back; messages received " +
			"per message acknowledged in the whole run, in %, and how fast they came (over at most the " +
			"read-back limit; n/a for stored when the queue did not come back whole in time). " +
			"fsyncs: fsync and fdatasync calls (also sync_file_range and syncfs, which none of these " +
			"brokers makes) the broker started in the measured interval, per second and per PUBACK, " +
			"counted by strace in a second run of the scenario on a fresh broker: strace stops the broker " +
			"at every such call, which slows it, so that run's PUBACKs per second are shown beside them " +
			"and nowhere else.")
		var rows [][]string
		for _, sc := range scs {
			traced := sc + tracedSuffix
			for i, r := range []struct {
				scenario, unit, label string
				format                func(float64) string
			}{
				{sc, "disk-B/msg", "disk bytes per message", figure},
				{sc, "disk-KiB/s", "disk KiB/s", figure},
				{sc, "stored-%", "stored, % of acknowledged", figure},
				{sc, "replay-msgs/s", "queue read back, msgs/s", figure},
				{traced, "fsyncs/msg", "fsyncs per message (strace)", small},
				{traced, "fsyncs/s", "fsyncs/s (strace)", figure},
				{traced, "acks/s", "PUBACKs/s (strace)", figure},
			} {
				name := ""
				if i == 0 {
					name = "`" + sc + "`"
				}
				cells := []string{name, r.label}
				for _, br := range s.brokers {
					cells = append(cells, s.value(r.scenario, br, r.unit, r.format))
				}
				rows = append(rows, cells)
			}
		}
		align, head := s.head("", "scenario", "figure")
		w.table(align, head, rows...)
	}
	s.writeProblems(w)
}

// storageCaveats says what each broker's PUBACK promises, without which
// the throughput figures cannot be compared.
func storageCaveats(w *markdown) {
	w.heading(2, "What a PUBACK means here")
	w.list(
		"**fieldgate** acknowledges a QoS 1 PUBLISH once the batch holding its queue entry for every "+
			"persistent session is fsynced. Commits from all connections that arrive while one is being "+
			"written share the next transaction and its fsync (group commit): durable at PUBACK.",
		"**mochi + bolt**: the hook writes or deletes every record in a bbolt transaction of its own, which "+
			"bbolt commits with fdatasync (two calls: the data pages, then the meta page). For each message it "+
			"stores an in-flight record of the PUBACK, sends the PUBACK, deletes that record, then stores one "+
			"in-flight record per offline session, all on the publisher's connection before it reads the next "+
			"packet. So the PUBACK goes out before the queued copies are on disk: not strictly durable at "+
			"PUBACK, though a message is on disk a few fsyncs later. A session that reconnects right after the "+
			"last PUBACK can therefore miss the last few messages (a stored figure a little under 100): they "+
			"were still being written to the session it took over. After a pause of a few seconds before the "+
			"reconnect, every message comes back. mochi also keeps at most 8,192 messages "+
			"per offline session (`MaximumInflight`) and drops the rest, which the stored figure would show.",
		"**Mosquitto** with `persistence true` keeps sessions and queues in memory and writes its whole "+
			"state to `persistence_location` every `autosave_interval` (1,800 s by default) and at shutdown, "+
			"not per message: nothing reaches the disk during a run, and a crash loses every message since the "+
			"last save. Its figures are not durable at PUBACK; they show the cost of the protocol work alone.",
	)
}
