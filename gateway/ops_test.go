package gateway

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/fieldgate/fieldgate/internal/testkit"
)

// TestOpsEndpoint runs the embedded default with its ops endpoint and
// checks every endpoint over real HTTP against the running gateway.
func TestOpsEndpoint(t *testing.T) {
	cfg := embeddedGateway(t, t.TempDir()+"/state.db")
	cfg.Ops.Address = testkit.FreeAddr(t)
	startGateway(t, cfg)
	col, _ := collect(t, cfg.Listeners[0].Address, "fieldgate/e2e/#")
	col.wait(t, "a reading", func(last map[string]mqtt.Message, _ map[string]int) bool {
		return last["fieldgate/e2e/climate/temperature"] != nil
	})
	base := "http://" + cfg.Ops.Address
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != 200 || !strings.Contains(body, "ok") {
		t.Errorf("/healthz = %d %q", code, body)
	}
	if code, body := get("/readyz"); code != 200 {
		t.Errorf("/readyz = %d %q, want ready with no bridges", code, body)
	}
	code, metrics := get("/metrics")
	for _, want := range []string{
		`fieldgate_sensor_reads_total{sensor="climate"`,
		`fieldgate_sensor_value{`,
		"fieldgate_broker_clients_connected ",
		"fieldgate_storage_file_bytes ",
		"go_goroutines ",
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if code != 200 {
		t.Errorf("/metrics = %d", code)
	}
	code, page := get("/")
	if code != 200 || !strings.Contains(page, "climate") || !strings.Contains(page, "pump") {
		t.Errorf("status page = %d, want the sensors and the pump on it", code)
	}

	// The switch on loopback needs no credentials; it acts like a command.
	resp, err := http.PostForm(base+"/outputs/pump", url.Values{"state": {"on"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode >= 400 {
		t.Fatalf("switch = %d", resp.StatusCode)
	}
	col.wait(t, "the pump on", func(last map[string]mqtt.Message, _ map[string]int) bool {
		m := last["fieldgate/e2e/pump/state"]
		return m != nil && string(m.Payload()) == "ON"
	})
}
