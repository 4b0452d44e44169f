// Command relreport writes docs/RELIABILITY.md from the records the
// reliability suite leaves (internal/relrecord), and records the bounded
// fuzz runs make soak and make test make, so that the report states what
// was measured in one run, by the commands that measured it.
//
//	relreport fuzz -dir DIR -target 'PKG FUZZNAME' -log FILE -rc N
//	relreport fail -dir DIR -case NAME -detail TEXT
//	relreport write -dir DIR -out docs/RELIABILITY.md [-summary] [-require SUITES]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/fieldgate/fieldgate/internal/relrecord"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: relreport fuzz|write [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "fuzz":
		err = fuzzCmd(os.Args[2:])
	case "write":
		err = writeCmd(os.Args[2:])
	case "fail":
		err = failCmd(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q; use fuzz, fail or write", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "relreport:", err)
		os.Exit(1)
	}
}

// execsLine matches go test -fuzz's progress lines:
// "fuzz: elapsed: 30s, execs: 123456 (4115/sec), new interesting: 3 (total: 40)".
var execsLine = regexp.MustCompile(`elapsed: (\d+)s, execs: (\d+) \((\d+)/sec\)(?:, new interesting: (\d+) \(total: (\d+)\))?`)

// fuzzResult turns one bounded fuzz run's output and exit status into a
// record.
func fuzzResult(target, log string, rc, reruns int) relrecord.Result {
	res := relrecord.Result{Suite: "fuzz", Case: target, Pass: rc == 0, Test: target}
	if relrecord.Soak() {
		res.Mode = "soak"
	} else {
		res.Mode = "short"
	}
	var last []string
	for _, m := range execsLine.FindAllStringSubmatch(log, -1) {
		last = m
	}
	if last != nil {
		res.Figures = append(res.Figures,
			relrecord.Figure{Name: "elapsed", Value: last[1] + " s"},
			relrecord.Figure{Name: "executions", Value: last[2]},
			relrecord.Figure{Name: "per second", Value: last[3]})
		if last[5] != "" {
			res.Figures = append(res.Figures, relrecord.Figure{Name: "corpus", Value: last[5]})
		}
	}
	if reruns > 0 {
		res.Figures = append(res.Figures, relrecord.Figure{Name: "reruns",
			Value: fmt.Sprintf("%d (a run before ended on Go's fuzz deadline race, go.dev/issue/75804, with no failing input)", reruns)})
	}
	if !res.Pass {
		res.Failure = firstFailure(log)
	}
	return res
}

// firstFailure returns the lines of a failed run that say why.
func firstFailure(log string) string {
	for _, line := range strings.Split(log, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "--- FAIL") || strings.Contains(line, "panic:") || strings.Contains(line, "Failing input written to") {
			return line
		}
	}
	return "the run failed; its log says why"
}

func fuzzCmd(args []string) error {
	fs := flag.NewFlagSet("fuzz", flag.ContinueOnError)
	dir := fs.String("dir", "", "directory of the records")
	target := fs.String("target", "", "the package and the fuzz target, such as 'matcher FuzzIndex'")
	logPath := fs.String("log", "", "the go test -fuzz output")
	rc := fs.Int("rc", 0, "go test's exit status")
	reruns := fs.Int("reruns", 0, "runs before this one that ended on Go's fuzz deadline race")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || *target == "" || *logPath == "" {
		return fmt.Errorf("fuzz: -dir, -target and -log are required")
	}
	log, err := os.ReadFile(*logPath)
	if err != nil {
		return err
	}
	res := fuzzResult(*target, string(log), *rc, *reruns)
	res.Finished = time.Now().UTC().Format(time.RFC3339)
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	name := "fuzz--" + strings.NewReplacer(" ", "_", "/", "_").Replace(*target) + ".json"
	return os.WriteFile(filepath.Join(*dir, name), append(b, '\n'), 0o644)
}

// failCmd records a failure that left no record of its own, such as the
// test binary failing to build or timing out, so that the report cannot
// pass over it.
func failCmd(args []string) error {
	fs := flag.NewFlagSet("fail", flag.ContinueOnError)
	dir := fs.String("dir", "", "directory of the records")
	name := fs.String("case", "", "what failed, such as 'go test ./gateway/reliability'")
	detail := fs.String("detail", "", "why, and where the log is")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || *name == "" {
		return fmt.Errorf("fail: -dir and -case are required")
	}
	res := relrecord.Result{Suite: "run", Case: *name, Pass: false, Failure: *detail, Test: *name,
		Finished: time.Now().UTC().Format(time.RFC3339), Mode: "short"}
	if relrecord.Soak() {
		res.Mode = "soak"
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	file := "run--" + strings.NewReplacer(" ", "_", "/", "_").Replace(*name) + ".json"
	return os.WriteFile(filepath.Join(*dir, file), append(b, '\n'), 0o644)
}

// suites lists the report's sections in order, each with what it checks
// and the target it holds the gateway to.
var suites = []struct{ id, title, what string }{
	{"crash", "Crash consistency",
		"The real binary under QoS 1 and QoS 2 load, with persistent subscribers and an active bridge to a Mosquitto upstream, is killed with SIGKILL at random moments and restarted on the same state file. Target: acknowledged messages lost = 0 (locally and upstream), QoS 2 duplicates = 0; QoS 1 duplicates are counted."},
	{"bridge-outage", "Bridge outages",
		"A publisher sends numbered QoS 1 messages on two routes while the upstream goes away in different ways. Target: everything the gateway acknowledged arrives upstream, in order per route."},
	{"bridge-nats", "Bridge to a NATS cluster",
		"The bridge against a three-node NATS cluster with JetStream and its MQTT listener, every MQTT stream replicated on the three nodes: a cloud broker that speaks MQTT 3.1.1 only, refuses QoS 2 publishes (reject_qos2_publish) and closes the link on a topic it cannot take. Gateways publish numbered QoS 1 messages; what NATS acknowledged is counted per gateway in the order of its message stream's sequence numbers. Cases: the MQTT 3.1.1 fallback, remembered across link drops; a QoS 2 route learned down to QoS 1; a refused topic moved to the dead letters, or refused at the route by the nats topic rules; a fleet of gateways through a node SIGKILLed and restarted on its store, gateways SIGKILLed and restarted on their state files, links cut hard and links blackholed. Target: acknowledged messages lost = 0 and out of order = 0 for every gateway, no reconnect storm; QoS 1 duplicates are counted."},
	{"slow-consumer", "Slow consumers",
		"One subscriber reads 10 msg/s while publishers send 2,000 msg/s. Target: the gateway's RSS stays within the configured budgets; the other subscribers' p99 latency stays under 50 ms."},
	{"connection-storm", "Connection storms",
		"Thousands of clients connect at once, then clients reconnect 100 times a second. Target: no leak: RSS and goroutines back to their baseline."},
	{"malformed", "Malformed input over TCP",
		"A corpus of malformed MQTT packets is sent to the running gateway; after every case a control client connects, subscribes, publishes and receives. Target: no panic, and the broker answers the control client after every case."},
	{"hostile", "Hostile clients",
		"Attacks a client on the LAN can make against the running gateway, each tried over the network: reading another user's messages, outliving a revoked permission, flooding logins, exhausting sessions, filters, retained bytes and the ops endpoint. Target: every attack is refused or bounded, and the bound's cost in memory and disk is measured."},
	{"fuzz", "Fuzz targets",
		"Every decoder's fuzz target, run for a bounded time. Target: no crash, no broken invariant."},
	{"bad-config", "Bad configuration",
		"A table of broken configuration files, each given to `fieldgate check`. Target: every one is rejected with an error naming the key and the line."},
}

func writeCmd(args []string) error {
	fs := flag.NewFlagSet("write", flag.ContinueOnError)
	dir := fs.String("dir", "", "directory of the records")
	out := fs.String("out", "", "the Markdown file to write; - for standard output")
	summary := fs.Bool("summary", false, "only the summary table")
	command := fs.String("command", "make soak", "the command that produced the records")
	var all []string
	for _, s := range suites {
		all = append(all, s.id)
	}
	require := fs.String("require", strings.Join(all, ","), "suites that must have records, comma-separated")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || *out == "" {
		return fmt.Errorf("write: -dir and -out are required")
	}
	recs, err := load(*dir)
	if err != nil {
		return err
	}
	if len(recs) == 0 {
		return fmt.Errorf("write: no records in %s; did the suite run?", *dir)
	}
	var w io.Writer = os.Stdout
	if *out != "-" {
		f, err := os.Create(*out + ".tmp")
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	env := environment()
	if *summary {
		writeSummary(w, recs)
	} else {
		writeReport(w, recs, env, *command)
	}
	if *out != "-" {
		if err := os.Rename(*out+".tmp", *out); err != nil {
			return err
		}
	}
	var missing []string
	for _, id := range strings.Split(*require, ",") {
		found := false
		for _, r := range recs {
			found = found || r.Suite == id
		}
		if id != "" && !found {
			missing = append(missing, id)
		}
	}
	switch {
	case failed(recs) > 0:
		return fmt.Errorf("%d of %d cases failed", failed(recs), len(recs))
	case len(missing) > 0:
		return fmt.Errorf("no records of %s: those suites did not run", strings.Join(missing, ", "))
	}
	return nil
}

func failed(recs []relrecord.Result) int {
	n := 0
	for _, r := range recs {
		if !r.Pass {
			n++
		}
	}
	return n
}

// load reads every record in dir, in report order.
func load(dir string) ([]relrecord.Result, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	var recs []relrecord.Result
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		var r relrecord.Result
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		recs = append(recs, r)
	}
	order := map[string]int{}
	for i, s := range suites {
		order[s.id] = i
	}
	sort.SliceStable(recs, func(i, j int) bool {
		oi, iok := order[recs[i].Suite]
		oj, jok := order[recs[j].Suite]
		if !iok {
			oi = len(suites)
		}
		if !jok {
			oj = len(suites)
		}
		if oi != oj {
			return oi < oj
		}
		if recs[i].Suite != recs[j].Suite {
			return recs[i].Suite < recs[j].Suite
		}
		return recs[i].Case < recs[j].Case
	})
	return recs, nil
}

type env struct{ machine, goVersion, commit, mosquitto, nats string }

func environment() env {
	e := env{goVersion: runtime.Version(), machine: machine()}
	if out, err := exec.Command("git", "describe", "--always", "--dirty").Output(); err == nil {
		e.commit = strings.TrimSpace(string(out))
	}
	if out, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", "mosquitto").Output(); err == nil {
		e.mosquitto = "Debian package " + strings.TrimSpace(string(out))
	}
	// The server the bridge-nats cases ran, as make's tools step built it
	// (internal/testkit/natscluster): "nats-server: v2.15.3".
	if out, err := exec.Command(filepath.Join("bin", "testtools", "nats-server"), "--version").Output(); err == nil {
		e.nats = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(out)), "nats-server:"))
	}
	return e
}

func machine() string {
	cpu := runtime.GOARCH
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kb); err == nil {
			mem = fmt.Sprintf(", %d MiB of memory", kb>>10)
		}
	}
	return fmt.Sprintf("%s, %d cores%s, %s/%s", cpu, runtime.NumCPU(), mem, runtime.GOOS, runtime.GOARCH)
}

func result(r relrecord.Result) string {
	if r.Pass {
		return "pass"
	}
	return "**FAIL**"
}

// cell makes text safe inside a Markdown table cell.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// keyFigures is the short form of a case's figures for the summary: the
// first few.
func keyFigures(r relrecord.Result) string {
	var parts []string
	for i, f := range r.Figures {
		if i == 4 {
			parts = append(parts, "…")
			break
		}
		parts = append(parts, f.Name+" "+f.Value)
	}
	return cell(strings.Join(parts, "; "))
}

func writeSummary(w io.Writer, recs []relrecord.Result) {
	fmt.Fprintln(w, "| suite | case | mode | result | time | figures |")
	fmt.Fprintln(w, "|---|---|---|---|--:|---|")
	for _, r := range recs {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %.0f s | %s |\n", r.Suite, cell(r.Case), r.Mode, result(r), r.Seconds, keyFigures(r))
	}
	fmt.Fprintf(w, "\n%d cases, %d failed.\n", len(recs), failed(recs))
}

func writeReport(w io.Writer, recs []relrecord.Result, e env, command string) {
	modes := map[string]bool{}
	var finished string
	for _, r := range recs {
		modes[r.Mode] = true
		if r.Finished > finished {
			finished = r.Finished
		}
	}
	var ms []string
	for m := range modes {
		ms = append(ms, m)
	}
	sort.Strings(ms)

	fmt.Fprint(w, `# Reliability

This file is written by `+"`"+command+"`"+` from what the reliability suite
measured in one run: every figure below comes from the run, and a case that
failed says so. The suite is in `+"`gateway/reliability`"+` (the fault tests,
against the real binary and, for the bridge, a real Mosquitto and a real
NATS cluster), the fuzz
targets next to the decoders they exercise, and `+"`scripts/relreport`"+`
(this report).

- `+"`make soak`"+`: every case at full length (100 kills, a 10-minute outage,
  5-minute slow-consumer and churn runs, 10,000 clients at once, a fleet
  of gateways into a NATS cluster through its fault timeline, then every
  fuzz target for `+"`SOAK_FUZZTIME`"+` (20 s), then this report.
  About an hour.
- `+"`make test`"+` runs the same cases at a short length (step
  `+"`test-reliability`"+`) and prints the summary table; it does not write
  this file.

`)
	fmt.Fprintf(w, "- Run: %s, mode %s, finished %s.\n", e.commit, strings.Join(ms, "+"), finished)
	fmt.Fprintf(w, "- Machine: %s; Go %s", e.machine, strings.TrimPrefix(e.goVersion, "go"))
	if e.mosquitto != "" {
		fmt.Fprintf(w, "; Mosquitto %s", e.mosquitto)
	}
	if e.nats != "" {
		fmt.Fprintf(w, "; NATS server %s", e.nats)
	}
	fmt.Fprint(w, ".\n\n## Summary\n\n")
	writeSummary(w, recs)

	bySuite := map[string][]relrecord.Result{}
	for _, r := range recs {
		bySuite[r.Suite] = append(bySuite[r.Suite], r)
	}
	for _, s := range suites {
		rs := bySuite[s.id]
		fmt.Fprintf(w, "\n## %s\n\n%s\n", s.title, s.what)
		if len(rs) == 0 {
			fmt.Fprint(w, "\nNot run in this run.\n")
			continue
		}
		for _, r := range rs {
			fmt.Fprintf(w, "\n### %s: %s\n\n", r.Case, result(r))
			fmt.Fprintf(w, "`%s`, %s, %.0f s.", r.Test, r.Mode, r.Seconds)
			if r.Failure != "" {
				fmt.Fprintf(w, " Failure: %s", r.Failure)
			}
			fmt.Fprint(w, "\n")
			if len(r.Figures) > 0 {
				fmt.Fprint(w, "\n| figure | value |\n|---|---|\n")
				for _, f := range r.Figures {
					fmt.Fprintf(w, "| %s | %s |\n", cell(f.Name), cell(f.Value))
				}
			}
		}
	}
	known := map[string]bool{}
	for _, s := range suites {
		known[s.id] = true
	}
	for _, r := range recs {
		if !known[r.Suite] {
			fmt.Fprintf(w, "\n## %s: %s\n\n%s, %.0f s.\n", r.Suite, r.Case, result(r), r.Seconds)
		}
	}
}
