package footprint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// IdleConfig says which gateway Idle measures and for how long.
type IdleConfig struct {
	Label        string        // names the configuration in the raw line: default, sensors50-nobridge...
	PID          int           // the gateway's process
	Ops          string        // host:port of its ops endpoint
	Bridged      bool          // wait for a bridge to be up before measuring, and check it stayed up
	Settle       time.Duration // left alone after ready (and the bridge up) before the first sample
	Duration     time.Duration // between the two samples
	ReadyTimeout time.Duration // how long the gateway may take to become ready, its bridge up
}

// ErrBridgeDown is Idle's error when a bridge was expected up and is not.
var ErrBridgeDown = errors.New("footprint: the bridge is not up")

// procTimes is what the kernel has counted for a process: its CPU time
// in clock ticks, its threads' time on a CPU and how often they got one,
// and their context switches.
type procTimes struct {
	at         time.Time
	utime      uint64 // ticks in user mode, threads that ended included
	stime      uint64 // ticks in the kernel
	runNS      uint64 // sum over the live threads of schedstat's time on a CPU
	timeslices uint64 // sum over the live threads of schedstat's runs on a CPU: their wake-ups
	switches   uint64 // sum over the live threads of voluntary and involuntary context switches
	threads    int
}

// clockTick is the unit of utime and stime in /proc/PID/stat: USER_HZ,
// which Linux fixes at 100 for every architecture's user space.
const clockTick = 10 * time.Millisecond

// Idle waits until the gateway of cfg is ready (and, when cfg.Bridged,
// its bridge up), leaves it alone for cfg.Settle, then reads the CPU time
// the kernel has counted for it, again cfg.Duration later, and writes one
// "idle" line to out: CPU seconds and percent of one core, wake-ups and
// context switches a second, and what the gateway did meanwhile (sensor
// reads, messages the bridge sent). Nothing touches the gateway between
// the two readings: /metrics is scraped before the first and after the
// second, since a scrape is work for the gateway too.
func Idle(ctx context.Context, cfg IdleConfig, out io.Writer) error {
	launched := time.Now()
	client := &http.Client{Timeout: metricsTimeout}
	if err := awaitReady(ctx, client, WatchConfig{Label: cfg.Label, PID: cfg.PID, Ops: cfg.Ops, ReadyTimeout: cfg.ReadyTimeout}); err != nil {
		return err
	}
	metrics := "http://" + cfg.Ops + "/metrics"
	if cfg.Bridged {
		if err := awaitBridge(ctx, client, cfg, metrics, launched.Add(cfg.ReadyTimeout)); err != nil {
			return err
		}
	}
	ready := time.Since(launched)
	if !sleep(ctx, cfg.Settle) {
		return ctx.Err()
	}
	m0, err := scrape(ctx, client, metrics)
	if err != nil {
		return fmt.Errorf("footprint: %s: %w", cfg.Label, err)
	}
	t0, err := readProcTimes(cfg.PID)
	if err != nil {
		return fmt.Errorf("%w (%s): %v", ErrExited, cfg.Label, err)
	}
	if !sleep(ctx, cfg.Duration) {
		return ctx.Err()
	}
	t1, err := readProcTimes(cfg.PID)
	if err != nil {
		return fmt.Errorf("%w (%s) while measured: %v", ErrExited, cfg.Label, err)
	}
	m1, err := scrape(ctx, client, metrics)
	if err != nil {
		return fmt.Errorf("footprint: %s: %w", cfg.Label, err)
	}

	secs := t1.at.Sub(t0.at).Seconds()
	cpu := time.Duration(t1.utime+t1.stime-t0.utime-t0.stime) * clockTick
	fmt.Fprintf(out, "idle %s seconds=%.1f cpu_s=%.2f cpu_pct=%.4f user_s=%.2f system_s=%.2f run_s=%.4f"+
		" wakeups_per_s=%.1f switches_per_s=%.1f threads=%d ready_s=%.1f sensors=%d sensor_reads=%.0f"+
		" bridged=%t bridge_up=%.0f bridge_sent=%.0f bridge_reconnects=%.0f\n",
		cfg.Label, secs, cpu.Seconds(), 100*cpu.Seconds()/secs,
		(time.Duration(t1.utime-t0.utime) * clockTick).Seconds(), (time.Duration(t1.stime-t0.stime) * clockTick).Seconds(),
		float64(t1.runNS-min(t0.runNS, t1.runNS))/1e9,
		float64(t1.timeslices-min(t0.timeslices, t1.timeslices))/secs, float64(t1.switches-min(t0.switches, t1.switches))/secs,
		t1.threads, ready.Seconds(), m1.series["fieldgate_sensor_up"],
		m1.sum["fieldgate_sensor_reads_total"]-m0.sum["fieldgate_sensor_reads_total"],
		cfg.Bridged, m1.sum["fieldgate_bridge_up"],
		m1.sum["fieldgate_bridge_messages_sent_total"]-m0.sum["fieldgate_bridge_messages_sent_total"],
		m1.sum["fieldgate_bridge_reconnects_total"]-m0.sum["fieldgate_bridge_reconnects_total"])
	if cfg.Bridged && (m1.sum["fieldgate_bridge_up"] < 1 || m1.sum["fieldgate_bridge_reconnects_total"] != m0.sum["fieldgate_bridge_reconnects_total"]) {
		return fmt.Errorf("%w for the whole measurement (%s): it reconnected or is down at the end", ErrBridgeDown, cfg.Label)
	}
	return nil
}

// awaitBridge polls /metrics until fieldgate_bridge_up says every bridge
// is up, or until deadline.
func awaitBridge(ctx context.Context, client *http.Client, cfg IdleConfig, metrics string, deadline time.Time) error {
	for {
		m, err := scrape(ctx, client, metrics)
		if err == nil && m.series["fieldgate_bridge_up"] > 0 && m.sum["fieldgate_bridge_up"] == float64(m.series["fieldgate_bridge_up"]) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w within %v (%s)", ErrBridgeDown, cfg.ReadyTimeout, cfg.Label)
		}
		if !sleep(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// sleep waits d; false if ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// readProcTimes reads what the kernel has counted for process pid, from
// /proc/PID/stat and each thread's schedstat and status.
func readProcTimes(pid int) (procTimes, error) {
	p := procTimes{at: time.Now()}
	dir := fmt.Sprintf("/proc/%d", pid)
	stat, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return p, err
	}
	if p.utime, p.stime, err = parseStatTimes(string(stat)); err != nil {
		return p, fmt.Errorf("%s/stat: %w", dir, err)
	}
	tasks, err := os.ReadDir(dir + "/task")
	if err != nil {
		return p, err
	}
	for _, task := range tasks {
		tdir := filepath.Join(dir, "task", task.Name())
		// A thread may end between the listing and the reads: it is
		// left out, as it would be a moment later.
		if sched, err := os.ReadFile(tdir + "/schedstat"); err == nil {
			run, slices, err := parseSchedstat(string(sched))
			if err != nil {
				return p, fmt.Errorf("%s/schedstat: %w", tdir, err)
			}
			p.runNS += run
			p.timeslices += slices
		}
		if status, err := os.ReadFile(tdir + "/status"); err == nil {
			p.switches += parseSwitches(string(status))
		}
		p.threads++
	}
	return p, nil
}

// parseStatTimes returns utime and stime, fields 14 and 15 of
// /proc/PID/stat, counting after the command name, which is in
// parentheses and may hold spaces.
func parseStatTimes(stat string) (utime, stime uint64, err error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0, errors.New("no command name in parentheses")
	}
	// After the name come fields 3 (state) onwards.
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("%d fields after the name, want at least 13", len(f))
	}
	if utime, err = strconv.ParseUint(f[11], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("utime: %w", err)
	}
	if stime, err = strconv.ParseUint(f[12], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("stime: %w", err)
	}
	return utime, stime, nil
}

// parseSchedstat returns a thread's time on a CPU in nanoseconds and how
// many times it ran: the first and third fields of its schedstat.
func parseSchedstat(s string) (runNS, timeslices uint64, err error) {
	f := strings.Fields(s)
	if len(f) < 3 {
		return 0, 0, fmt.Errorf("%d fields, want 3", len(f))
	}
	if runNS, err = strconv.ParseUint(f[0], 10, 64); err != nil {
		return 0, 0, err
	}
	timeslices, err = strconv.ParseUint(f[2], 10, 64)
	return runNS, timeslices, err
}

// parseSwitches returns a thread's voluntary and involuntary context
// switches from its status.
func parseSwitches(status string) uint64 {
	var n uint64
	for line := range strings.Lines(status) {
		key, val, ok := strings.Cut(line, ":")
		if ok && (key == "voluntary_ctxt_switches" || key == "nonvoluntary_ctxt_switches") {
			v, _ := strconv.ParseUint(strings.TrimSpace(val), 10, 64)
			n += v
		}
	}
	return n
}
