package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/fieldgate/fieldgate/gateway/config"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/matcher"
	"github.com/fieldgate/fieldgate/sensors"
	"github.com/fieldgate/fieldgate/storage"
)

// embeddedGateway is the embedded default configuration on a free port and
// a temporary state file, with every interval shortened to a second.
func embeddedGateway(t *testing.T, statePath string) *config.Config {
	t.Helper()
	cfg, err := config.Parse(config.EmbeddedName, config.Embedded())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listeners[0].Address = testkit.FreeAddr(t)
	cfg.Ops.Address = ""
	cfg.Storage.Path = statePath
	cfg.Gateway.Name = "e2e"
	for i := range cfg.Sensors {
		cfg.Sensors[i].Interval = time.Second
		cfg.Sensors[i].Jitter = 100 * time.Millisecond
	}
	return cfg
}

// gatewayStart bounds how long startGateway waits for Run to finish
// starting, before the time scale: far above how long a start takes, the
// discovery pass's dozen stored publishes included.
const gatewayStart = 20 * time.Second

// startGateway runs cfg until the returned stop is called. It returns once
// Run has logged that the gateway started: the listeners are bound, and
// what the sensors publish at start (availability, the safe states, the
// discovery pass with its removals) is stored, so a client that connects
// then finds it retained, not still on its way.
func startGateway(t *testing.T, cfg *config.Config) (stop func()) {
	t.Helper()
	var out testkit.Buffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	ctx, cancel := context.WithCancel(context.Background())
	var runErr error
	finished := make(chan struct{})
	go func() {
		runErr = Run(ctx, cfg, log, "e2e")
		close(finished)
	}()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gateway log:\n%s", out.String())
		}
	})
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-finished
			if runErr != nil {
				t.Errorf("Run: %v", runErr)
			}
		})
	}
	t.Cleanup(stop)
	testkit.WaitFor(t, gatewayStart, "the gateway to start", func() bool {
		select {
		case <-finished:
			t.Fatalf("Run returned before the gateway started: %v", runErr)
		default:
		}
		return strings.Contains(out.String(), "gateway started")
	})
	return stop
}

// collector is a real MQTT client that keeps the last message per topic.
type collector struct {
	mu   sync.Mutex
	last map[string]mqtt.Message
	n    map[string]int
}

// collect connects a real client to addr that keeps what it gets on
// filters; it disconnects when the test ends.
func collect(t *testing.T, addr string, filters ...string) (*collector, mqtt.Client) {
	t.Helper()
	return collectAs(t, addr, "", "", filters...)
}

// collectAs is collect, logged in as user with password (neither when
// user is empty).
func collectAs(t *testing.T, addr, user, password string, filters ...string) (*collector, mqtt.Client) {
	t.Helper()
	col := &collector{last: map[string]mqtt.Message{}, n: map[string]int{}}
	opts := mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(fmt.Sprintf("e2e-%d", time.Now().UnixNano())).SetAutoReconnect(false)
	if user != "" {
		opts.SetUsername(user).SetPassword(password)
	}
	c := mqtt.NewClient(opts)
	if tok := c.Connect(); !tok.WaitTimeout(testkit.Scale(5*time.Second)) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(100) })
	for _, f := range filters {
		tok := c.Subscribe(f, 1, func(_ mqtt.Client, m mqtt.Message) {
			col.mu.Lock()
			col.last[m.Topic()] = m
			col.n[m.Topic()]++
			col.mu.Unlock()
		})
		if !tok.WaitTimeout(testkit.Scale(5*time.Second)) || tok.Error() != nil {
			t.Fatalf("subscribe %s: %v", f, tok.Error())
		}
	}
	return col, c
}

// wait polls until cond holds on the collected messages, or fails.
func (c *collector) wait(t *testing.T, what string, cond func(last map[string]mqtt.Message, n map[string]int) bool) {
	t.Helper()
	deadline := time.Now().Add(testkit.Scale(15 * time.Second))
	for time.Now().Before(deadline) {
		c.mu.Lock()
		ok := cond(c.last, c.n)
		c.mu.Unlock()
		if ok {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var topics []string
	for tp, m := range c.last {
		topics = append(topics, tp+" = "+string(m.Payload()))
	}
	t.Fatalf("timed out waiting for %s; got:\n%s", what, strings.Join(topics, "\n"))
}

// TestSensorsEndToEnd runs the gateway on its embedded default (the
// simulated bus) and checks with a real MQTT client what a user sees:
// readings as JSON, availability, Home Assistant discovery, a relay that
// follows commands, and the safe state and offline mark left at shutdown.
func TestSensorsEndToEnd(t *testing.T) {
	state := t.TempDir() + "/state.db"
	cfg := embeddedGateway(t, state)
	stop := startGateway(t, cfg)
	col, c := collect(t, cfg.Listeners[0].Address, "fieldgate/#", "homeassistant/#")

	var wantReadings []string
	for _, s := range cfg.Sensors {
		wantReadings = append(wantReadings, "fieldgate/e2e/"+s.Name+"/")
	}
	// A sensor publishes its quantities one by one, so a reading from every
	// sensor is not yet every quantity: wait for the eight the check below
	// wants too.
	col.wait(t, "a reading from every sensor, and at least 8 quantities", func(last map[string]mqtt.Message, _ map[string]int) bool {
		quantities := 0
		for tp := range last {
			if isReading(tp) {
				quantities++
			}
		}
		if quantities < 8 {
			return false
		}
		for _, prefix := range wantReadings {
			found := false
			for tp := range last {
				if strings.HasPrefix(tp, prefix) && !strings.HasSuffix(tp, "/status") {
					found = true
				}
			}
			if !found {
				return false
			}
		}
		return true
	})

	col.mu.Lock()
	readings := 0
	for tp, m := range col.last {
		if !isReading(tp) {
			continue
		}
		var r struct {
			Value *float64 `json:"value"`
			Unit  *string  `json:"unit"`
			TS    string   `json:"ts"`
		}
		if err := json.Unmarshal(m.Payload(), &r); err != nil || r.Value == nil || r.Unit == nil {
			t.Errorf("%s: payload %s is not {value, unit, ts}: %v", tp, m.Payload(), err)
			continue
		}
		if ts, err := time.Parse(time.RFC3339, r.TS); err != nil || time.Since(ts) > time.Minute || time.Since(ts) < -time.Second {
			t.Errorf("%s: ts %q is not a recent RFC 3339 time", tp, r.TS)
		}
		readings++
	}
	if a := col.last["fieldgate/e2e/availability"]; a == nil || string(a.Payload()) != "online" || !a.Retained() {
		t.Errorf("availability = %v, want retained online", a)
	}
	col.mu.Unlock()
	if readings < 8 {
		t.Errorf("%d distinct readings, want at least 8 quantities from the simulated sensors", readings)
	}

	// Discovery: a retained config per quantity, each pointing at a state
	// topic that carries readings, and a switch for the pump. The configs
	// are retained before the first reading; wait for a reading on each.
	col.wait(t, "discovery configs, and a reading on each sensor's state topic", func(last map[string]mqtt.Message, _ map[string]int) bool {
		if last["homeassistant/switch/fieldgate_e2e/pump/config"] == nil ||
			last["homeassistant/sensor/fieldgate_e2e/climate_temperature/config"] == nil {
			return false
		}
		for tp, m := range last {
			var dc struct {
				StateTopic string `json:"state_topic"`
			}
			if strings.HasPrefix(tp, "homeassistant/sensor/") && json.Unmarshal(m.Payload(), &dc) == nil && dc.StateTopic != "" && last[dc.StateTopic] == nil {
				return false
			}
		}
		return true
	})
	col.mu.Lock()
	for tp, m := range col.last {
		if !strings.HasPrefix(tp, "homeassistant/") {
			continue
		}
		var dc struct {
			StateTopic   string `json:"state_topic"`
			UniqueID     string `json:"unique_id"`
			CommandTopic string `json:"command_topic"`
			Device       struct {
				Identifiers []string `json:"identifiers"`
			} `json:"device"`
		}
		if err := json.Unmarshal(m.Payload(), &dc); err != nil || dc.StateTopic == "" || dc.UniqueID == "" || len(dc.Device.Identifiers) == 0 {
			t.Errorf("%s: discovery config %s lacks state_topic, unique_id or device: %v", tp, m.Payload(), err)
		}
		if strings.Contains(tp, "/sensor/") && col.last[dc.StateTopic] == nil {
			t.Errorf("%s: state_topic %s carries nothing", tp, dc.StateTopic)
		}
		if strings.Contains(tp, "/switch/") && dc.CommandTopic != "fieldgate/e2e/pump/set" {
			t.Errorf("switch command_topic = %q", dc.CommandTopic)
		}
	}
	col.mu.Unlock()

	// The relay starts in its safe state and follows commands; a bad
	// command changes nothing.
	state0 := func(want string) func(map[string]mqtt.Message, map[string]int) bool {
		return func(last map[string]mqtt.Message, _ map[string]int) bool {
			m := last["fieldgate/e2e/pump/state"]
			return m != nil && string(m.Payload()) == want
		}
	}
	col.wait(t, "pump OFF at start", state0("OFF"))
	c.Publish("fieldgate/e2e/pump/set", 1, false, "ON").WaitTimeout(testkit.Scale(5 * time.Second))
	col.wait(t, "pump ON after the command", state0("ON"))
	// "1" is ON again: the state it publishes, after "maybe" was handled,
	// is the moment to look.
	col.mu.Lock()
	states := col.n["fieldgate/e2e/pump/state"]
	col.mu.Unlock()
	c.Publish("fieldgate/e2e/pump/set", 1, false, "maybe").WaitTimeout(testkit.Scale(5 * time.Second))
	c.Publish("fieldgate/e2e/pump/set", 1, false, "1").WaitTimeout(testkit.Scale(5 * time.Second))
	col.wait(t, "the pump's state after both commands", func(_ map[string]mqtt.Message, n map[string]int) bool {
		return n["fieldgate/e2e/pump/state"] > states
	})
	col.wait(t, "pump still ON", state0("ON"))

	// Home Assistant coming online gets the configs again.
	col.mu.Lock()
	before := col.n["homeassistant/switch/fieldgate_e2e/pump/config"]
	col.mu.Unlock()
	c.Publish("homeassistant/status", 0, false, "online").WaitTimeout(testkit.Scale(5 * time.Second))
	col.wait(t, "discovery republished", func(_ map[string]mqtt.Message, n map[string]int) bool {
		return n["homeassistant/switch/fieldgate_e2e/pump/config"] > before
	})

	stop()
	// What the gateway left behind: offline, and the pump back in its safe state.
	retained := readRetained(t, state, "fieldgate/e2e/#")
	if got := retained["fieldgate/e2e/availability"]; got != "offline" {
		t.Errorf("retained availability after shutdown = %q, want offline", got)
	}
	if got := retained["fieldgate/e2e/pump/state"]; got != "OFF" {
		t.Errorf("retained pump state after shutdown = %q, want OFF (its safe state)", got)
	}
}

// isReading tells the readings with a value and unit under the gateway's
// prefix from its other topics: availability, a sensor's status, and the
// states of outputs and contacts (the topics ending in /state).
func isReading(topic string) bool {
	return strings.HasPrefix(topic, "fieldgate/e2e/") && !strings.HasSuffix(topic, "/status") &&
		!strings.HasSuffix(topic, "/state") && !strings.HasSuffix(topic, "/availability")
}

// TestDiscoveryRemovesDroppedSensor checks that a sensor taken out of the
// configuration loses its Home Assistant entity at the next start.
func TestDiscoveryRemovesDroppedSensor(t *testing.T) {
	state := t.TempDir() + "/state.db"
	cfg := embeddedGateway(t, state)
	stop := startGateway(t, cfg)
	col, _ := collect(t, cfg.Listeners[0].Address, "homeassistant/#")
	col.wait(t, "climate discovery", func(last map[string]mqtt.Message, _ map[string]int) bool {
		return last["homeassistant/sensor/fieldgate_e2e/climate_temperature/config"] != nil
	})
	stop()
	if n := len(readRetained(t, state, "homeassistant/+/fieldgate_e2e/climate_temperature/config")); n != 1 {
		t.Fatalf("%d retained climate configs after the first run, want 1", n)
	}

	cfg2 := embeddedGateway(t, state)
	var kept []sensors.Sensor
	for _, s := range cfg2.Sensors {
		if s.Name != "climate" {
			kept = append(kept, s)
		}
	}
	cfg2.Sensors = kept
	// The start's discovery pass removes climate's configs, and startGateway
	// returns only once the start is over, those removals stored; stopping
	// at any moment after it must leave them removed.
	stop2 := startGateway(t, cfg2)
	col2, _ := collect(t, cfg2.Listeners[0].Address, "homeassistant/#")
	col2.wait(t, "another sensor's discovery", func(last map[string]mqtt.Message, _ map[string]int) bool {
		return last["homeassistant/switch/fieldgate_e2e/pump/config"] != nil
	})
	stop2()
	retained := readRetained(t, state, "homeassistant/#")
	for tp := range retained {
		if strings.Contains(tp, "/climate_") {
			t.Errorf("discovery config %s still retained after climate was removed", tp)
		}
	}
	if len(retained) == 0 {
		t.Error("no discovery configs retained at all")
	}
}

// readRetained reads the retained messages matching filter from a stopped
// gateway's state file.
func readRetained(t *testing.T, path, filter string) map[string]string {
	t.Helper()
	db, err := storage.OpenReadOnly(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	out := map[string]string{}
	if err := db.MatchRetained(filter, matcher.Matches, func(m *storage.Message) { out[m.Topic] = string(m.Payload) }); err != nil {
		t.Fatal(err)
	}
	return out
}

// readmeYAML returns the yaml blocks of the README's section under the
// heading "## "+heading, failing the test when it has none.
func readmeYAML(t *testing.T, heading string) []string {
	t.Helper()
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## "+heading+"\n")
	if !ok {
		t.Fatalf("the README has no section %q", heading)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var blocks []string
	for {
		var block string
		if _, section, ok = strings.Cut(section, "```yaml\n"); !ok {
			break
		}
		block, section, _ = strings.Cut(section, "```")
		blocks = append(blocks, block)
	}
	if len(blocks) == 0 {
		t.Fatalf("the README's section %q has no yaml block", heading)
	}
	return blocks
}

// TestREADMEConfigurationParses keeps the README's configuration example
// true: it must be accepted, sensor drivers and their options included.
func TestREADMEConfigurationParses(t *testing.T) {
	cfg, err := config.Parse("README.md", []byte(readmeYAML(t, "Configuration")[0]))
	if err != nil {
		t.Fatalf("the README's example configuration is rejected:\n%v", err)
	}
	if len(cfg.Sensors) < 2 || len(cfg.Outputs) < 1 {
		t.Errorf("parsed %d sensors and %d outputs; the example shows sensors and an output", len(cfg.Sensors), len(cfg.Outputs))
	}
}
