package gateway

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/fieldgate/fieldgate/gateway/config"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/sensors"
)

type reloadResult struct {
	applied, restart []string
	err              error
}

// TestReload applies configurations to a running gateway: what can change
// live changes, what cannot is reported, and a configuration that cannot
// be applied leaves the running one in place.
func TestReload(t *testing.T) {
	cfg := embeddedGateway(t, t.TempDir()+"/state.db")
	reload := make(chan *config.Config)
	results := make(chan reloadResult, 1)
	level := new(slog.LevelVar)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- RunWith(ctx, cfg, nil, Options{Version: "t", Level: level, Reload: reload,
			Reloaded: func(a, r []string, err error) { results <- reloadResult{a, r, err} }})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	col, _ := collectWhenUp(t, cfg.Listeners[0].Address, "fieldgate/e2e/+/+")
	col.wait(t, "the climate sensor", func(last map[string]mqtt.Message, _ map[string]int) bool {
		return last["fieldgate/e2e/climate/temperature"] != nil
	})

	apply := func(c *config.Config) reloadResult {
		t.Helper()
		reload <- c
		select {
		case r := <-results:
			return r
		case <-time.After(testkit.Scale(30 * time.Second)):
			t.Fatal("no reload result")
			return reloadResult{}
		}
	}

	// Live: the log level, and the sensors (one removed, one renamed).
	next := *cfg
	next.Log.Level = "debug"
	next.Sensors = slices.Clone(cfg.Sensors)
	next.Sensors[0].Name = "climate2"
	next.Listeners = slices.Clone(cfg.Listeners)
	next.Listeners[0].Name = "renamed"
	r := apply(&next)
	if r.err != nil {
		t.Fatalf("reload: %v", r.err)
	}
	if level.Level() != slog.LevelDebug || !slices.Contains(r.applied, "log.level") || !slices.Contains(r.applied, "sensors") {
		t.Errorf("applied %v, level %v; want log.level and sensors applied", r.applied, level.Level())
	}
	if !slices.Contains(r.restart, "listeners") {
		t.Errorf("restart %v, want listeners reported", r.restart)
	}
	col.wait(t, "the renamed sensor", func(last map[string]mqtt.Message, _ map[string]int) bool {
		return last["fieldgate/e2e/climate2/temperature"] != nil
	})

	// Not applicable: an output on a pin the simulated hardware lacks. The
	// running configuration stays, sensors included.
	bad := next
	bad.Outputs = []sensors.Output{{Name: "ghost", Bus: "sim", Pin: "SIM_OUT9", SafeState: "off", QoS: 1}}
	r = apply(&bad)
	if r.err == nil || !strings.Contains(r.err.Error(), "SIM_OUT9") {
		t.Fatalf("reload with a missing pin = %v, want an error naming it", r.err)
	}
	col.mu.Lock()
	before := col.n["fieldgate/e2e/climate2/temperature"]
	col.mu.Unlock()
	col.wait(t, "readings to go on after the refused reload", func(_ map[string]mqtt.Message, n map[string]int) bool {
		return n["fieldgate/e2e/climate2/temperature"] > before
	})
}

// collectWhenUp connects once the gateway listens.
func collectWhenUp(t *testing.T, addr string, filters ...string) (*collector, mqtt.Client) {
	t.Helper()
	deadline := time.Now().Add(testkit.Scale(10 * time.Second))
	for {
		c, err := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://"+addr).SetClientID("probe")).Connect(), error(nil)
		if c.WaitTimeout(testkit.Scale(time.Second)) && c.Error() == nil && err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway not up at %s", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return collect(t, addr, filters...)
}
