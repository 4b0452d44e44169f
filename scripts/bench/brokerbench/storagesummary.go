package brokerbench

import (
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Targets for fieldgate's storage, judged at the largest publisher count
// measured (100 in a full run), where group commit has the most to share.
const (
	minPersistVsMochi = 5.0 // fieldgate PUBACKs/s ÷ mochi+bolt PUBACKs/s
	maxFsyncsPerMsg   = 0.1 // fieldgate sync calls per PUBACK: one fsync shared by ten messages or more
)

var persistRE = regexp.MustCompile(`^persist-qos1-(\d+)x(\d+)$`)

// WriteStorageMarkdown renders the persistence scenarios (bench-storage.sh):
// PUBACKs per second, fsyncs and disk bytes, durability caveats and the
// storage targets.
func (s *Summary) WriteStorageMarkdown(w io.Writer) error {
	var b strings.Builder
	var scs []string
	for _, sc := range s.scenariosWith("persist-") {
		if !strings.HasSuffix(sc, tracedSuffix) {
			scs = append(scs, sc)
		}
	}
	s.storageHeader(&b)
	s.storageTargets(&b, scs)
	storageCaveats(&b)
	if len(scs) > 0 {
		section(&b, "Throughput: PUBACKs per second",
			"`persist-qos1-100x3`: 100 publishers send QoS 1 messages of distinct topics as fast as the broker "+
				"acknowledges them, each with a window of unacknowledged messages, while 3 persistent sessions "+
				"subscribed to every topic are disconnected: every message is queued three times for sessions that are away.")
		s.tableHead(&b, ours+" ÷ %s", "scenario")
		for _, sc := range scs {
			s.row(&b, sc, "acks/s", true, true, "`"+sc+"`")
		}
		fmt.Fprintln(&b)

		section(&b, "Disk: sync calls and bytes written",
			"Disk bytes: the growth of `write_bytes` in /proc/PID/io over the measured interval (what the "+
				"kernel must write to the device for the broker; a page counts again each time it is dirtied "+
				"after a flush), per PUBACK and per second. Stored: after measuring, the publishers stop and "+
				"collect their last PUBACKs, one session reconnects and reads its queue back; messages received "+
				"per message acknowledged in the whole run, in %, and how fast they came (over at most the "+
				"read-back limit; n/a for stored when the queue did not come back whole in time). "+
				"fsyncs: fsync and fdatasync calls (also sync_file_range and syncfs, which none of these "+
				"brokers makes) the broker started in the measured interval, per second and per PUBACK, "+
				"counted by strace in a second run of the scenario on a fresh broker: strace stops the broker "+
				"at every such call, which slows it, so that run's PUBACKs per second are shown beside them "+
				"and nowhere else.")
		s.tableHead(&b, "", "scenario", "figure")
		for _, sc := range scs {
			traced := sc + tracedSuffix
			for i, r := range []struct {
				scenario, unit, label string
				format                func(float64) string
			}{
				{sc, "disk-B/msg", "disk bytes per message", fmtNum},
				{sc, "disk-KiB/s", "disk KiB/s", fmtNum},
				{sc, "stored-%", "stored, % of acknowledged", fmtNum},
				{sc, "replay-msgs/s", "queue read back, msgs/s", fmtNum},
				{traced, "fsyncs/msg", "fsyncs per message (strace)", fmtFloat},
				{traced, "fsyncs/s", "fsyncs/s (strace)", fmtNum},
				{traced, "acks/s", "PUBACKs/s (strace)", fmtNum},
			} {
				name := ""
				if i == 0 {
					name = "`" + sc + "`"
				}
				s.rowFormat(&b, r.scenario, r.unit, r.format, name, r.label)
			}
		}
		fmt.Fprintln(&b)
	}
	s.problems(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

func (s *Summary) storageHeader(b *strings.Builder) {
	m := s.meta
	s.writeHeader(b, "Persisted QoS 1 publishing: fieldgate vs mochi-mqtt + bolt vs Mosquitto",
		"one broker at a time, each started afresh on a new state file for every scenario",
		fmt.Sprintf("State files: %s", orUnknown(m["disk"])),
		fmt.Sprintf("Go: %s", orUnknown(m["go"])),
		fmt.Sprintf("fieldgate: %s, its `storage` package (bbolt, group commit)", orUnknown(m["fieldgate"])),
		fmt.Sprintf("mochi-mqtt: %s, its full `Server` with the bolt storage hook (`hooks/storage/bolt`, default options) on bbolt %s",
			orUnknown(m["mochi"]), orUnknown(m["bbolt"])),
		fmt.Sprintf("Mosquitto: %s, `persistence true`, `autosave_interval` left at its default, `max_queued_messages 0`", orUnknown(m["mosquitto"])),
		fmt.Sprintf("fsync counts: %s", orUnknown(m["strace"])),
	)
	fmt.Fprintln(b)
}

// storageCaveats says what each broker's PUBACK promises, without which
// the throughput figures cannot be compared.
func storageCaveats(b *strings.Builder) {
	section(b, "What a PUBACK means here", "")
	for _, c := range []string{
		"**fieldgate** acknowledges a QoS 1 PUBLISH once the batch holding its queue entry for every " +
			"persistent session is fsynced. Commits from all connections that arrive while one is being " +
			"written share the next transaction and its fsync (group commit): durable at PUBACK.",
		"**mochi + bolt**: the hook writes or deletes every record in a bbolt transaction of its own, which " +
			"bbolt commits with fdatasync (two calls: the data pages, then the meta page). For each message it " +
			"stores an in-flight record of the PUBACK, sends the PUBACK, deletes that record, then stores one " +
			"in-flight record per offline session, all on the publisher's connection before it reads the next " +
			"packet. So the PUBACK goes out before the queued copies are on disk: not strictly durable at " +
			"PUBACK, though a message is on disk a few fsyncs later. A session that reconnects right after the " +
			"last PUBACK can therefore miss the last few messages (a stored figure a little under 100): they " +
			"were still being written to the session it took over. After a pause of a few seconds before the " +
			"reconnect, every message comes back. mochi also keeps at most 8,192 messages " +
			"per offline session (`MaximumInflight`) and drops the rest, which the stored figure would show.",
		"**Mosquitto** with `persistence true` keeps sessions and queues in memory and writes its whole " +
			"state to `persistence_location` every `autosave_interval` (1,800 s by default) and at shutdown, " +
			"not per message: nothing reaches the disk during a run, and a crash loses every message since the " +
			"last save. Its figures are not durable at PUBACK; they show the cost of the protocol work alone.",
	} {
		fmt.Fprintf(b, "- %s\n", c)
	}
	fmt.Fprintln(b)
}

// storageTargets judges fieldgate at the scenario with the most publishers.
func (s *Summary) storageTargets(b *strings.Builder, scs []string) {
	sc, pubs := "", 0
	for _, name := range scs {
		if m := persistRE.FindStringSubmatch(name); m != nil {
			if n, _ := strconv.Atoi(m[1]); n > pubs {
				sc, pubs = name, n
			}
		}
	}
	at := fmt.Sprintf("at %d publishers", pubs)
	if pubs != 100 && pubs != 0 {
		at += " (the most measured; the target is for 100)"
	}
	if pubs == 0 {
		at = "at 100 publishers"
	}
	var only []string
	if sc != "" {
		only = []string{sc}
	}
	vs := []verdict{
		s.ratioTarget(fmt.Sprintf("PUBACKs/s ≥ %s× mochi + bolt %s", fmtConst(minPersistVsMochi), at),
			only, "mochi", "acks/s", true, minPersistVsMochi),
		s.fsyncTarget(fmt.Sprintf("fsyncs per message ≤ 1/%s %s", fmtConst(1/maxFsyncsPerMsg), at), sc),
	}
	section(b, "Targets", "")
	fmt.Fprintln(b, "| target | result |")
	fmt.Fprintln(b, "|---|---|")
	for _, v := range vs {
		fmt.Fprintf(b, "| %s | %s |\n", v.name, v.result)
	}
	fmt.Fprintln(b)
}

// fsyncTarget judges fieldgate's sync calls per message in the traced run
// of scenario sc.
func (s *Summary) fsyncTarget(name, sc string) verdict {
	if sc == "" {
		return verdict{name, s.notMeasured(nil, ours)}
	}
	traced := sc + tracedSuffix
	f := s.get(traced, ours, "fsyncs/msg")
	switch {
	case !f.ok && !s.ran(traced, ours):
		if s.ran(sc, ours) {
			return verdict{name, "not measured: no run under strace (" + orUnknown(s.meta["strace"]) + ")"}
		}
		return verdict{name, s.notMeasured([]string{traced}, ours)}
	case !f.ok:
		return verdict{name, "not measured: no fsync counts in the run under strace"}
	}
	txt := fmt.Sprintf("%s %s per message", sc, fmtFloat(f.v))
	if f.v > 0 {
		txt += fmt.Sprintf(" (one per %s messages)", fmtNum(1/f.v))
	}
	if f.v > maxFsyncsPerMsg {
		return verdict{name, "**✗ " + txt + "**"}
	}
	return verdict{name, "✓ " + txt}
}

// rowFormat writes one table row without ratios: lead cells, then each
// broker's figure in format, or what value says when there is none.
func (s *Summary) rowFormat(b *strings.Builder, scenario, unit string, format func(float64) string, lead ...string) {
	cells := slices.Clone(lead)
	for _, br := range s.brokers {
		if f := s.get(scenario, br, unit); f.ok {
			cells = append(cells, format(f.v))
		} else {
			cells = append(cells, s.value(scenario, br, unit))
		}
	}
	fmt.Fprintf(b, "| %s |\n", strings.Join(cells, " | "))
}

// fmtFloat shows small figures, such as fsyncs per message, with three
// significant digits.
func fmtFloat(v float64) string {
	if v >= 100 || v == 0 {
		return fmtNum(v)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}
