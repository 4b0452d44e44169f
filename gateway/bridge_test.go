package gateway

import (
	"fmt"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/fieldgate/fieldgate/gateway/config"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/internal/testkit/mosquitto"
)

// TestBridgeEndToEnd runs the embedded default with a bridge to a real
// upstream (mosquitto): the simulated readings reach the cloud, a cloud
// command switches the pump and its new state comes back up, and the
// gateway's availability there follows its life.
func TestBridgeEndToEnd(t *testing.T) {
	up := mosquitto.Start(t, mosquitto.Cloud())
	doc := string(config.Embedded()) + fmt.Sprintf(`
bridges:
  - name: cloud
    address: %q
    reconnect_min: 100ms
    reconnect_max: 500ms
    out:
      - {filter: "fieldgate/{device}/#", topic: "site-7/{topic}"}
    in:
      - {filter: "commands/{device}/+", topic: "fieldgate/{device}/{3}/set"}
`, up.Addr())
	cfg, err := config.Parse("bridge.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listeners[0].Address = testkit.FreeAddr(t)
	cfg.Ops.Address = ""
	cfg.Storage.Path = t.TempDir() + "/state.db"
	cfg.Gateway.Name = "e2e"
	for i := range cfg.Sensors {
		cfg.Sensors[i].Interval = time.Second
		cfg.Sensors[i].Jitter = 100 * time.Millisecond
	}
	cloud, c := collect(t, up.Addr(), "site-7/#")
	stop := startGateway(t, cfg)

	cloud.wait(t, "readings and availability upstream", func(last map[string]mqtt.Message, _ map[string]int) bool {
		a := last["site-7/fieldgate/e2e/availability"]
		return last["site-7/fieldgate/e2e/climate/temperature"] != nil && a != nil && string(a.Payload()) == "online"
	})
	cloud.mu.Lock()
	if p := string(cloud.last["site-7/fieldgate/e2e/climate/temperature"].Payload()); !strings.Contains(p, `"unit":"°C"`) {
		t.Errorf("temperature upstream = %s, want the JSON reading", p)
	}
	cloud.mu.Unlock()

	c.Publish("commands/e2e/pump", 1, false, "ON").WaitTimeout(testkit.Scale(5 * time.Second))
	cloud.wait(t, "the pump's new state upstream", func(last map[string]mqtt.Message, _ map[string]int) bool {
		m := last["site-7/fieldgate/e2e/pump/state"]
		return m != nil && string(m.Payload()) == "ON"
	})

	stop()
	cloud.wait(t, "offline upstream after shutdown", func(last map[string]mqtt.Message, _ map[string]int) bool {
		a := last["site-7/fieldgate/e2e/availability"]
		return a != nil && string(a.Payload()) == "offline"
	})
}

// TestTwoBridges: each configured upstream gets its own routes and outbox.
func TestTwoBridges(t *testing.T) {
	a, b := mosquitto.Start(t, mosquitto.Cloud()), mosquitto.Start(t, mosquitto.Cloud())
	doc := fmt.Sprintf(`storage: {path: %q}
broker: {allow_anonymous: true}
listeners: [{name: lan, type: tcp, address: %q}]
ops: {address: ""}
gateway: {name: two}
bridges:
  - name: ops-cloud
    address: %q
    out: [{filter: "ops/#"}]
  - name: billing
    address: %q
    out: [{filter: "meter/#", class: state}]
`, t.TempDir()+"/state.db", testkit.FreeAddr(t), a.Addr(), b.Addr())
	cfg, err := config.Parse("two.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	atA, _ := collect(t, a.Addr(), "#")
	atB, _ := collect(t, b.Addr(), "#")
	startGateway(t, cfg)
	_, local := collect(t, cfg.Listeners[0].Address)
	local.Publish("ops/cpu", 1, false, "42").WaitTimeout(testkit.Scale(5 * time.Second))
	local.Publish("meter/kwh", 1, false, "1234").WaitTimeout(testkit.Scale(5 * time.Second))
	atA.wait(t, "ops at the first upstream", func(last map[string]mqtt.Message, _ map[string]int) bool { return last["ops/cpu"] != nil })
	atB.wait(t, "the meter at the second", func(last map[string]mqtt.Message, _ map[string]int) bool { return last["meter/kwh"] != nil })
	time.Sleep(300 * time.Millisecond)
	atA.mu.Lock()
	defer atA.mu.Unlock()
	atB.mu.Lock()
	defer atB.mu.Unlock()
	if atA.last["meter/kwh"] != nil || atB.last["ops/cpu"] != nil {
		t.Error("a message reached the upstream whose routes do not match it")
	}
}
