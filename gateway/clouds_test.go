package gateway

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/fieldgate/fieldgate/gateway/bridge"
	"github.com/fieldgate/fieldgate/gateway/broker"
	"github.com/fieldgate/fieldgate/gateway/config"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/internal/testkit/mosquitto"
	"github.com/fieldgate/fieldgate/internal/testkit/natscluster"
)

// The README's "Bridging to real clouds" examples are whole configuration
// files. Each must pass the check fieldgate check runs, and those with a
// local stand-in run against it (Mosquitto set up the way that cloud behaves,
// or a real NATS server), with only the address, the certificate paths and
// the secret changed.

// cloudExamples returns the yaml blocks of the README's "Bridging to real
// clouds" section by the name of their bridge, failing the test for one
// that does not pass the check.
func cloudExamples(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, block := range readmeYAML(t, "Bridging to real clouds") {
		cfg, err := config.Parse("README.md", []byte(block))
		if err != nil {
			t.Errorf("a README example fails the check:\n%v\n%s", err, block)
			continue
		}
		if len(cfg.Bridges) != 1 {
			t.Errorf("a README example has %d bridges, want 1:\n%s", len(cfg.Bridges), block)
			continue
		}
		out[cfg.Bridges[0].Name] = block
	}
	return out
}

// TestCloudExamplesPassTheCheck: every example of the README's cloud
// section is a configuration fieldgate check accepts, one for each cloud.
func TestCloudExamplesPassTheCheck(t *testing.T) {
	ex := cloudExamples(t)
	for _, name := range []string{"aws", "azure", "nats", "emqx"} {
		if ex[name] == "" {
			t.Errorf("no README example with a bridge named %s", name)
		}
	}
}

// cloudGateway is the README's example for bridge name, on a free
// loopback port and a temporary state file, taking anonymous local
// clients, reconnecting quickly, and with its secret in a file when it
// has one.
func cloudGateway(t *testing.T, name, secret string) *config.Config {
	t.Helper()
	cfg, err := config.Parse("README.md", []byte(cloudExamples(t)[name]))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listeners = []broker.Listener{{Name: "lan", Type: broker.ListenerTCP, Address: testkit.FreeAddr(t)}}
	cfg.Broker.AllowAnonymous = true
	cfg.Ops.Address = ""
	cfg.Storage.Path = filepath.Join(t.TempDir(), "state.db")
	b := &cfg.Bridges[0]
	b.ReconnectMin, b.ReconnectMax = 100*time.Millisecond, 500*time.Millisecond
	if b.PasswordFile != "" {
		b.PasswordFile = filepath.Join(t.TempDir(), "secret")
		if err := os.WriteFile(b.PasswordFile, []byte(secret+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return cfg
}

// publishLocal publishes at QoS 1 through a local client and waits for
// the gateway's PUBACK.
func publishLocal(t *testing.T, c mqtt.Client, topic, payload string) {
	t.Helper()
	if tok := c.Publish(topic, 1, false, payload); !tok.WaitTimeout(testkit.Scale(5*time.Second)) || tok.Error() != nil {
		t.Fatalf("publish %s: %v", topic, tok.Error())
	}
}

// TestCloudExampleAWS runs the AWS IoT Core example against Mosquitto with
// mutual TLS and QoS 1 at most: telemetry and a shadow update go up under
// the thing's client id and certificate, and a shadow delta comes down.
func TestCloudExampleAWS(t *testing.T) {
	up := mosquitto.Start(t, mosquitto.Config{TLS: true, RequireCertificate: true, Listener: []string{"max_qos 1"}})
	cfg := cloudGateway(t, "aws", "")
	b := &cfg.Bridges[0]
	pki := up.PKI()
	b.Address, b.TLS.ServerName = up.TLSAddr(), "localhost"
	b.TLS.CAFile, b.TLS.Cert, b.TLS.Key = pki.CAFile, pki.ClientCert, pki.ClientKey
	cloud, app := collect(t, up.Addr(), "sites/#", "$aws/#")
	startGateway(t, cfg)
	lan := cfg.Listeners[0].Address
	local, pub := collect(t, lan, "fieldgate/greenhouse-1/shadow/delta")

	publishLocal(t, pub, "fieldgate/greenhouse-1/climate/temperature", `{"value":21.5}`)
	publishLocal(t, pub, "$aws/things/greenhouse-1/shadow/update", `{"state":{"reported":{"fan":"off"}}}`)
	cloud.wait(t, "the reading and the shadow update upstream", func(last map[string]mqtt.Message, _ map[string]int) bool {
		return last["sites/greenhouse-1/climate/temperature"] != nil && last["$aws/things/greenhouse-1/shadow/update"] != nil
	})
	app.Publish("$aws/things/greenhouse-1/shadow/update/delta", 1, false, `{"state":{"fan":"on"}}`).WaitTimeout(testkit.Scale(5 * time.Second))
	local.wait(t, "the shadow delta locally", func(last map[string]mqtt.Message, _ map[string]int) bool {
		m := last["fieldgate/greenhouse-1/shadow/delta"]
		return m != nil && string(m.Payload()) == `{"state":{"fan":"on"}}`
	})
}

// TestCloudExampleAzure runs the Azure IoT Hub example against Mosquitto
// over TLS on MQTT 3.1.1, with the device's hub user name and its token
// as the password and QoS 1 at most: telemetry goes to the device's
// events topic with its properties, a twin update goes up, a topic IoT
// Hub does not take is refused at the route, and cloud-to-device messages
// and twin responses come down.
func TestCloudExampleAzure(t *testing.T) {
	const (
		user  = "contoso-hub.azure-devices.net/greenhouse-1/?api-version=2021-04-12"
		token = "SharedAccessSignature sr=contoso-hub.azure-devices.net%2Fdevices%2Fgreenhouse-1&sig=dGVzdA%3D%3D&se=4102444800"
	)
	up := mosquitto.Start(t, mosquitto.Config{TLS: true, DenyAnonymous: true, Listener: []string{"max_qos 1"},
		Users: map[string]string{user: token, "backend": "backend-pass"}})
	cfg := cloudGateway(t, "azure", token)
	b := &cfg.Bridges[0]
	b.Address, b.TLS.CAFile, b.TLS.ServerName = up.TLSAddr(), up.PKI().CAFile, "localhost"
	cloud, app := collectAs(t, up.Addr(), "backend", "backend-pass", "devices/#", "$iothub/#")
	startGateway(t, cfg)
	local, pub := collect(t, cfg.Listeners[0].Address, "fieldgate/greenhouse-1/cloud/message", "$iothub/twin/res/#")

	publishLocal(t, pub, "fieldgate/greenhouse-1/climate/temperature", `{"value":21.5}`)
	publishLocal(t, pub, "$iothub/twin/res/200/?$rid=9", "not a device's to send") // refused at the route
	publishLocal(t, pub, "$iothub/twin/PATCH/properties/reported/?$rid=1", `{"fw":"1.2"}`)
	cloud.wait(t, "the reading and the twin update upstream", func(last map[string]mqtt.Message, _ map[string]int) bool {
		return last["devices/greenhouse-1/messages/events/sensor=climate&quantity=temperature"] != nil &&
			last["$iothub/twin/PATCH/properties/reported/?$rid=1"] != nil
	})
	cloud.mu.Lock()
	if cloud.last["$iothub/twin/res/200/?$rid=9"] != nil {
		t.Error("a topic IoT Hub does not take went upstream")
	}
	cloud.mu.Unlock()

	app.Publish("devices/greenhouse-1/messages/devicebound/%24.mid=7", 1, false, "ON").WaitTimeout(testkit.Scale(5 * time.Second))
	app.Publish("$iothub/twin/res/204/?$rid=1&$version=2", 1, false, "").WaitTimeout(testkit.Scale(5 * time.Second))
	local.wait(t, "the cloud-to-device message and the twin response locally", func(last map[string]mqtt.Message, _ map[string]int) bool {
		m := last["fieldgate/greenhouse-1/cloud/message"]
		return m != nil && string(m.Payload()) == "ON" && last["$iothub/twin/res/204/?$rid=1&$version=2"] != nil
	})
}

// TestCloudExampleEMQX runs the EMQX example against Mosquitto, another
// MQTT 5 broker, over TLS with a password: an alarm goes up at QoS 2 and
// a command comes down through the shared subscription.
func TestCloudExampleEMQX(t *testing.T) {
	up := mosquitto.Start(t, mosquitto.Config{TLS: true, DenyAnonymous: true,
		Users: map[string]string{"greenhouse-1": "emqx-pass", "backend": "backend-pass"}})
	cfg := cloudGateway(t, "emqx", "emqx-pass")
	b := &cfg.Bridges[0]
	b.Address, b.TLS.CAFile, b.TLS.ServerName = up.TLSAddr(), up.PKI().CAFile, "localhost"
	cloud, app := collectAs(t, up.Addr(), "backend", "backend-pass", "site-7/#")
	startGateway(t, cfg)
	local, pub := collect(t, cfg.Listeners[0].Address, "fieldgate/greenhouse-1/+/set")

	if tok := pub.Publish("alarms/fire", 2, false, "zone 3"); !tok.WaitTimeout(testkit.Scale(5*time.Second)) || tok.Error() != nil {
		t.Fatalf("publish the alarm: %v", tok.Error())
	}
	cloud.wait(t, "the alarm upstream", func(last map[string]mqtt.Message, _ map[string]int) bool {
		return last["site-7/alarms/fire"] != nil
	})
	app.Publish("commands/site-7/pump", 2, false, "ON").WaitTimeout(testkit.Scale(5 * time.Second))
	local.wait(t, "the shared command locally", func(last map[string]mqtt.Message, _ map[string]int) bool {
		m := last["fieldgate/greenhouse-1/pump/set"]
		return m != nil && string(m.Payload()) == "ON"
	})
}

// TestCloudExampleNATS runs the NATS example against a real NATS server
// with JetStream and its MQTT listener (no TLS or users here, so those
// keys are cleared): the bridge settles on MQTT 3.1.1, a reading goes up,
// a topic NATS cannot take is refused at the route by the nats preset
// (the link stays up), and a command comes down.
func TestCloudExampleNATS(t *testing.T) {
	up := natscluster.Start(t, natscluster.Config{Nodes: 1})
	addr := up.Node(0).MQTTAddr()
	cfg := cloudGateway(t, "nats", "")
	b := &cfg.Bridges[0]
	b.Address, b.TLS, b.Username, b.PasswordFile = addr, bridge.TLS{}, "", ""
	cloud, app := collect(t, addr, "site-7/#")
	startGateway(t, cfg)
	local, pub := collect(t, cfg.Listeners[0].Address, "fieldgate/greenhouse-1/+/set")

	if tok := pub.Publish("fieldgate/greenhouse-1/bad topic", 1, false, "x"); !tok.WaitTimeout(testkit.Scale(5 * time.Second)) {
		t.Fatal("no PUBACK for the refused topic")
	}
	publishLocal(t, pub, "fieldgate/greenhouse-1/climate/temperature", `{"value":21.5}`)
	cloud.wait(t, "the reading upstream", func(last map[string]mqtt.Message, _ map[string]int) bool {
		return last["site-7/fieldgate/greenhouse-1/climate/temperature"] != nil
	})
	if tok := app.Publish("commands/greenhouse-1/fan", 1, false, "ON"); !tok.WaitTimeout(testkit.Scale(5*time.Second)) || tok.Error() != nil {
		t.Fatalf("publish the command on NATS: %v", tok.Error())
	}
	local.wait(t, "the command locally", func(last map[string]mqtt.Message, _ map[string]int) bool {
		m := last["fieldgate/greenhouse-1/fan/set"]
		return m != nil && string(m.Payload()) == "ON"
	})
	// Queued before the reading, it would have come first.
	cloud.mu.Lock()
	n := cloud.n["site-7/fieldgate/greenhouse-1/bad topic"]
	cloud.mu.Unlock()
	if n != 0 {
		t.Errorf("the topic with a space reached NATS %d times", n)
	}
	if n := up.CountLog(natscluster.MQTT5Refusal); n != 0 {
		t.Errorf("NATS refused MQTT 5 %d times; the example says protocol 3.1.1", n)
	}
}
