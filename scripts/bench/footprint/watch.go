package footprint

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fieldgate/fieldgate/scripts/bench/brokerbench"
	"github.com/mochi-mqtt/server/v2/packets"
)

// WatchConfig says which gateway to follow and for how long.
type WatchConfig struct {
	Label        string        // names the binary in the raw lines: armv6, arm64, 386, amd64
	PID          int           // the process to sample: the gateway, or QEMU running it
	MQTT         string        // host:port of the gateway's MQTT listener
	Ops          string        // host:port of its ops endpoint
	Prefix       string        // topic prefix of the readings (gateway.topic_prefix)
	Duration     time.Duration // how long to sample once the gateway is ready
	Interval     time.Duration // time between samples
	ReadyTimeout time.Duration // how long the gateway may take to become ready
}

// Errors of Watch.
var (
	ErrNotReady   = errors.New("footprint: the gateway did not become ready")
	ErrExited     = errors.New("footprint: the process exited")
	ErrNoReadings = errors.New("footprint: no readings arrived")
)

// metricsTimeout bounds one scrape of /metrics; an emulated gateway
// answers in milliseconds, but a loaded machine can stretch that.
const metricsTimeout = 5 * time.Second

// sample is one second of a run.
type sample struct {
	t          time.Duration // since ready
	vmRSS      int64         // bytes, the process as the host sees it
	vmHWM      int64         // bytes, its peak resident set so far
	guestRSS   float64       // process_resident_memory_bytes: the gateway's own reading
	heap       float64       // go_heap_objects_bytes
	heapGoal   float64       // go_gc_heap_goal_bytes
	mapped     float64       // go_memory_mapped_bytes
	goroutines float64
	gcCycles   float64
	reads      float64 // sum of fieldgate_sensor_reads_total
	readings   int     // readings received over MQTT so far
}

// Watch waits until the gateway of cfg is ready, then samples it every
// cfg.Interval for cfg.Duration, writing a "sample" line per sample and an
// "rss" line at the end to out. It fails when the process exits, when
// the gateway never becomes ready, and when no reading arrives; the lines
// written up to then stand.
func Watch(ctx context.Context, cfg WatchConfig, out io.Writer) error {
	launched := time.Now()
	client := &http.Client{Timeout: metricsTimeout}
	if err := awaitReady(ctx, client, cfg); err != nil {
		return err
	}
	ready := time.Now()

	var readings readingCounter
	sub, err := brokerbench.Dial(ctx, cfg.MQTT, brokerbench.Options{ClientID: "footprint-" + cfg.Label, Timeout: 30 * time.Second})
	if err != nil {
		return fmt.Errorf("footprint: %s: %w", cfg.Label, err)
	}
	if err := sub.Subscribe(ctx, []string{cfg.Prefix + "/#"}, 0, readings.add); err != nil {
		sub.Close()
		return fmt.Errorf("footprint: %s: %w", cfg.Label, err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		var pk packets.Packet
		for sub.Read(&pk) == nil {
			if pk.FixedHeader.Type == packets.Publish {
				readings.add(&pk)
			}
		}
	})
	defer func() {
		sub.Close()
		wg.Wait()
	}()

	var samples []sample
	var sensors int
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	for {
		s, n, err := take(ctx, client, cfg, time.Since(ready))
		if err != nil {
			return err
		}
		s.readings = readings.total()
		sensors = n
		samples = append(samples, s)
		fmt.Fprintf(out, "sample %s t=%.0f vmrss=%d vmhwm=%d guest_rss=%.0f heap_objects=%.0f heap_goal=%.0f go_mapped=%.0f goroutines=%.0f gc_cycles=%.0f sensor_reads=%.0f readings=%d\n",
			cfg.Label, s.t.Seconds(), s.vmRSS, s.vmHWM, s.guestRSS, s.heap, s.heapGoal, s.mapped, s.goroutines, s.gcCycles, s.reads, s.readings)
		if s.t >= cfg.Duration {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}

	first, last := samples[0], samples[len(samples)-1]
	var maxRSS, maxGuest, maxHeap int64
	for _, s := range samples {
		maxRSS = max(maxRSS, s.vmRSS)
		maxGuest = max(maxGuest, int64(s.guestRSS))
		maxHeap = max(maxHeap, int64(s.heap))
	}
	got := readings.snapshot()
	fmt.Fprintf(out, "rss %s ready_s=%.2f seconds=%.0f samples=%d vmrss_start=%d vmrss_max=%d vmrss_end=%d vmhwm=%d"+
		" guest_rss_start=%.0f guest_rss_max=%d guest_rss_end=%.0f heap_start=%.0f heap_max=%d heap_end=%.0f heap_goal_end=%.0f"+
		" go_mapped_end=%.0f goroutines_end=%.0f gc_cycles=%.0f sensor_reads=%.0f readings=%d retained=%d other=%d sensors_seen=%d sensors=%d\n",
		cfg.Label, ready.Sub(launched).Seconds(), last.t.Seconds(), len(samples), first.vmRSS, maxRSS, last.vmRSS, last.vmHWM,
		first.guestRSS, maxGuest, last.guestRSS, first.heap, maxHeap, last.heap, last.heapGoal,
		last.mapped, last.goroutines, last.gcCycles-first.gcCycles, last.reads-first.reads,
		got.readings, got.retained, got.other, len(got.sensors), sensors)
	if got.readings == 0 {
		return fmt.Errorf("%w from %s over %v", ErrNoReadings, cfg.Label, last.t.Round(time.Second))
	}
	return nil
}

// awaitReady polls /readyz until it answers 200.
func awaitReady(ctx context.Context, client *http.Client, cfg WatchConfig) error {
	deadline := time.Now().Add(cfg.ReadyTimeout)
	url := "http://" + cfg.Ops + "/readyz"
	for {
		if _, _, err := readStatus(cfg.PID); err != nil {
			return fmt.Errorf("%w before it was ready (%s): %v", ErrExited, cfg.Label, err)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w within %v (%s, %s)", ErrNotReady, cfg.ReadyTimeout, cfg.Label, url)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// take reads one sample at t, and how many sensors the gateway reports.
func take(ctx context.Context, client *http.Client, cfg WatchConfig, t time.Duration) (sample, int, error) {
	s := sample{t: t}
	var err error
	if s.vmRSS, s.vmHWM, err = readStatus(cfg.PID); err != nil {
		return s, 0, fmt.Errorf("%w (%s) after %v ready: %v", ErrExited, cfg.Label, t.Round(time.Second), err)
	}
	m, err := scrape(ctx, client, "http://"+cfg.Ops+"/metrics")
	if err != nil {
		return s, 0, fmt.Errorf("footprint: %s: %w", cfg.Label, err)
	}
	s.guestRSS = m.sum["process_resident_memory_bytes"]
	s.heap = m.sum["go_heap_objects_bytes"]
	s.heapGoal = m.sum["go_gc_heap_goal_bytes"]
	s.mapped = m.sum["go_memory_mapped_bytes"]
	s.goroutines = m.sum["go_goroutines"]
	s.gcCycles = m.sum["go_gc_cycles_total"]
	s.reads = m.sum["fieldgate_sensor_reads_total"]
	return s, m.series["fieldgate_sensor_up"], nil
}

// readStatus returns VmRSS and VmHWM of process pid, in bytes. A process
// that has exited, a zombie included, has neither.
func readStatus(pid int) (rss, hwm int64, err error) {
	path := fmt.Sprintf("/proc/%d/status", pid)
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	var found int
	for line := range strings.Lines(string(data)) {
		key, val, ok := strings.Cut(line, ":")
		if !ok || (key != "VmRSS" && key != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %s %q: %w", path, key, val, err)
		}
		if key == "VmRSS" {
			rss = kb << 10
		} else {
			hwm = kb << 10
		}
		found++
	}
	if found < 2 {
		return 0, 0, fmt.Errorf("%s has no VmRSS or VmHWM (a zombie?)", path)
	}
	return rss, hwm, nil
}

// exposition is a /metrics page reduced to what the watcher needs: the
// sum of each family's samples and how many series it has.
type exposition struct {
	sum    map[string]float64
	series map[string]int
}

func scrape(ctx context.Context, client *http.Client, url string) (exposition, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return exposition{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return exposition{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return exposition{}, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return parseExposition(resp.Body)
}

// parseExposition reads the Prometheus text format: comment lines are
// skipped, and each sample line is NAME[{LABELS}] VALUE.
func parseExposition(r io.Reader) (exposition, error) {
	e := exposition{sum: map[string]float64{}, series: map[string]int{}}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue // NaN and Inf parse; anything else is not a sample
		}
		name := line[:i]
		if j := strings.IndexByte(name, '{'); j >= 0 {
			name = name[:j]
		}
		e.sum[name] += v
		e.series[name]++
	}
	return e, sc.Err()
}

// readingCounter counts what arrives on the readings' topics: readings
// (a JSON object with a value, on PREFIX/DEVICE/SENSOR/QUANTITY), retained
// messages (status and availability, the last of each delivered on
// subscribing) and the rest.
type readingCounter struct {
	mu       sync.Mutex
	readings int
	retained int
	other    int
	sensors  map[string]bool
}

func (c *readingCounter) add(pk *packets.Packet) {
	var body struct {
		Value *float64 `json:"value"`
	}
	levels := strings.Split(pk.TopicName, "/")
	isReading := !pk.FixedHeader.Retain && len(levels) == 4 &&
		bytes.HasPrefix(bytes.TrimSpace(pk.Payload), []byte("{")) &&
		json.Unmarshal(pk.Payload, &body) == nil && body.Value != nil
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case isReading:
		c.readings++
		if c.sensors == nil {
			c.sensors = map[string]bool{}
		}
		c.sensors[strings.Clone(levels[2])] = true // the topic aliases the read buffer
	case pk.FixedHeader.Retain:
		c.retained++
	default:
		c.other++
	}
}

func (c *readingCounter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.readings
}

// readingCounts is a copy of a readingCounter's figures.
type readingCounts struct {
	readings, retained, other int
	sensors                   map[string]bool
}

func (c *readingCounter) snapshot() readingCounts {
	c.mu.Lock()
	defer c.mu.Unlock()
	sensors := make(map[string]bool, len(c.sensors))
	for k := range c.sensors {
		sensors[k] = true
	}
	return readingCounts{c.readings, c.retained, c.other, sensors}
}
