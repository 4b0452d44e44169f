package report

import (
	"fmt"
	"path/filepath"

	"github.com/fieldgate/fieldgate/scripts/bench/targets"
)

// idleSummary is the cost at rest (bench-idle.sh): the CPU time of
// gateways left alone, ready and bridged, with no client traffic.
type idleSummary struct {
	name     string // the raw file, as the summary names it
	meta     meta
	configs  map[string]record // the "config" lines, by label
	runs     []record          // the "idle" lines, in the order measured
	problems []string
}

// The configurations bench-idle.sh measures, in the order the tables show
// them, and what each is.
var idleConfigs = []struct{ label, what string }{
	{"default", "embedded default, bridge connected, no traffic"},
	{"default-forwarding", "embedded default, bridge carrying the readings"},
	{"default-nobridge", "embedded default, no bridge"},
	{"sensors50", "50 simulated sensors, bridge connected, no traffic"},
	{"sensors50-forwarding", "50 simulated sensors, bridge carrying the readings"},
	{"sensors50-nobridge", "50 simulated sensors, no bridge"},
}

// idleJudged are the configurations the target is judged on: a gateway at
// rest, its bridge connected with nothing to carry.
var idleJudged = []string{"default", "sensors50"}

// newIdleSummary reads the raw output of one bench-idle.sh run.
func newIdleSummary(f *rawFile) idleSummary {
	s := idleSummary{name: "scripts/bench/results/" + filepath.Base(f.name), meta: f.meta,
		configs: map[string]record{}, problems: f.problems}
	for _, r := range f.records {
		switch r.kind {
		case "config":
			s.configs[r.label] = r
		case "idle":
			s.runs = append(s.runs, r)
		}
	}
	return s
}

func (s idleSummary) title() string { return "Cost at rest" }

func (s idleSummary) intro(w *markdown) {
	h := s.meta
	items := []string{
		fmt.Sprintf("Machine: %s, %s cores, %s/%s.", orUnknown(h.get("cpu")), orUnknown(h.get("cores")), orUnknown(h.get("goos")), orUnknown(h.get("goarch"))),
		fmt.Sprintf("Go: %s; fieldgate: %s; upstream: Mosquitto %s", orUnknown(h.get("go")), orUnknown(h.get("fieldgate")), orUnknown(h.get("mosquitto"))),
		fmt.Sprintf("Settings: %s; run %s", orUnknown(h.get("settings")), orUnknown(h.get("date"))),
	}
	if h.get("loadavg-start") != "" {
		items = append(items, fmt.Sprintf("Load average (1, 5, 15 min) at start: %s; at end: %s. CPU time is the gateway's own, whatever else runs; a busy machine still adds cache misses and migrations to it.",
			h.get("loadavg-start"), orUnknown(h.get("loadavg-end"))))
	}
	items = append(items, fmt.Sprintf("Raw output: `%s`; `scripts/bench/bench-idle.sh` made it.", s.name))
	w.list(items...)
}

// run returns the measurement of label.
func (s idleSummary) run(label string) (record, bool) {
	for _, r := range s.runs {
		if r.label == label {
			return r, true
		}
	}
	return record{}, false
}

// targets judges the CPU at rest of each configuration in idleJudged.
func (s idleSummary) targets() []verdict {
	var out []verdict
	for _, label := range idleJudged {
		what := label
		for _, c := range idleConfigs {
			if c.label == label {
				what = c.what
			}
		}
		target := fmt.Sprintf("CPU at rest ≤ %g %% of one core, %s", targets.MaxIdleCPUPct, what)
		r, ok := s.run(label)
		pct, okP := num(r, "cpu_pct")
		if !ok || !okP {
			out = append(out, notJudged(target, "not measured in this run"))
			continue
		}
		cpu, _ := num(r, "cpu_s")
		secs, _ := num(r, "seconds")
		out = append(out, judged(target, pct <= targets.MaxIdleCPUPct,
			fmt.Sprintf("%s %% (%.2f CPU s in %.0f s)", decimal(pct, 3), cpu, secs)))
	}
	return out
}

func (s idleSummary) body(w *markdown) {
	writeTargets(w, "Targets", s.targets())
	w.heading(2, "CPU at rest")
	if len(s.runs) == 0 {
		w.para("Not measured in this run.")
	} else {
		secs := 0.0
		for _, r := range s.runs {
			v, _ := num(r, "seconds")
			secs = max(secs, v)
		}
		w.para(fmt.Sprintf("Every configuration runs `fieldgate run` at the same time, each with its own ports and state file, and is measured for %.0f s once it has been ready, its bridge up, for the settling time. "+
			"CPU is `utime` + `stime` from `/proc/PID/stat` (every thread's, in 10 ms ticks) over the measured time, as a share of one core. "+
			"Wake-ups are the times the gateway's threads were put on a CPU (`/proc/PID/task/*/schedstat`; the raw output also has their context switches, which come to the same): on a board, each is a CPU leaving its idle state. "+
			"Sensor reads and messages sent upstream are what the gateway did meanwhile, from its `/metrics` before and after.", secs))
		var rows [][]string
		seen := map[string]bool{}
		row := func(label, what string) {
			r, ok := s.run(label)
			if !ok {
				return
			}
			seen[label] = true
			sensors := r.kv["sensors"]
			if c, ok := s.configs[label]; ok && sensors == "" {
				sensors = c.kv["sensors"]
			}
			pct, _ := num(r, "cpu_pct")
			cpu, _ := num(r, "cpu_s")
			user, _ := num(r, "user_s")
			sys, _ := num(r, "system_s")
			wake, _ := num(r, "wakeups_per_s")
			reads, _ := num(r, "sensor_reads")
			sent := "no bridge"
			if r.kv["bridged"] == "true" {
				n, _ := num(r, "bridge_sent")
				sent = thousands(n)
			}
			rows = append(rows, []string{"`" + label + "`", what, cell(sensors), decimal(pct, 3) + " %",
				fmt.Sprintf("%.2f (%.2f + %.2f)", cpu, user, sys), decimal(wake, 1), thousands(reads), sent})
		}
		for _, c := range idleConfigs {
			row(c.label, c.what)
		}
		for _, r := range s.runs {
			if !seen[r.label] {
				row(r.label, "")
			}
		}
		w.table("ll", []string{"configuration", "", "sensors", "CPU, % of a core", "CPU s (user + system)", "wake-ups/s", "sensor reads", "messages sent upstream"}, rows...)
		w.list(
			"**The bridge** goes to a local Mosquitto. In `default` and `sensors50` it is connected with an out-route that nothing publishes to (`bench/idle/#`): a bridge with no traffic, which the target is judged on. "+
				"The `-forwarding` twins carry the readings upstream (`fieldgate/#` at QoS 1), each written to the outbox with an fsync and deleted after its PUBACK: what the readings cost to forward. The `-nobridge` twins have no bridge.",
			"**The 50 sensors** are the four simulated I²C chips twelve times each, every `SENSOR_INTERVAL` (see the settings), and the two simulated GPIO inputs of the default: about as many readings a second as the default's six sensors take, so the difference from the default is what the number of sensors costs, not more work.",
			"**The simulated hardware is work too**: the water meter gives a pulse every 1 to 5 s, which the gateway counts and publishes at once, and every read of a simulated chip waits out its conversion time as on a board.",
			fmt.Sprintf("**The target**, %g %% of one core of this machine, is several times more of a Pi Zero 2 W's slower cores; a gateway that wakes while it has nothing to do keeps a core from its idle states, and on a solar site that is the board's power budget.", targets.MaxIdleCPUPct),
		)
	}
	if len(s.problems) > 0 {
		w.heading(2, "Problems in this run")
		w.list(s.problems...)
	}
}
