package reliability

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fieldgate/fieldgate/internal/testkit/mosquitto"
	"github.com/fieldgate/fieldgate/storage"
)

// deadOpsToken is the ops.token of the dead-letter case.
const deadOpsToken = "dead-letter-operator-token-0123"

// TestDeadLettersOnARunningGateway: a running gateway holds its state
// file, so dead letters are retried and dropped through its ops endpoint,
// over HTTP and with fieldgate db deadletters: a retried one reaches the
// real upstream, a dropped one is counted, bad input is refused naming
// it, and /metrics, the status page and the stopped gateway's file agree.
func TestDeadLettersOnARunningGateway(t *testing.T) {
	bin := buildGateway(t, t.TempDir())
	up := mosquitto.Start(t, mosquitto.Config{Quiet: true})
	cloud, _, err := dial(up.Addr(), "cloud-app", true, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cloud.close()
	if err := cloud.subscribe("up/#", 1); err != nil {
		t.Fatal(err)
	}
	g := newGatewayYAML(t, bin, `log:
  level: info
storage:
  path: %STATE%
broker:
  allow_anonymous: true
  sys_interval: 0s
listeners:
  - name: mqtt
    type: tcp
    address: %ADDR%
ops:
  address: %OPS%
  token: `+deadOpsToken+`
sensors: []
outputs: []
bridges:
  - name: cloud
    address: `+strconv.Quote(up.Addr())+`
    reconnect_min: 100ms
    reconnect_max: 500ms
    out:
      - {filter: "data/#", topic: "up/{2}"}
`)
	// Three dead letters from before the start, as a bridge moved them.
	db, err := storage.Open(g.dbPath, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var b storage.Batch
	for seq := uint64(1); seq <= 3; seq++ {
		b.DeadLetterPut("cloud", &storage.DeadLetter{Seq: seq, Reason: "server closed the link: invalid subject", At: 1_760_000_000e9, Failures: 3,
			Entry: storage.OutboxEntry{Seq: seq, Route: 0, Added: 1_760_000_000e9, Msg: storage.Message{Topic: fmt.Sprintf("up/dead-%d", seq), Payload: []byte(fmt.Sprint("reading ", seq)), QoS: 1}}})
	}
	if err := db.CommitWait(&b); err != nil {
		t.Fatal(err)
	}
	db.Close()

	g.start()
	g.awaitLog("dead letters from before are kept")
	if n := g.metric(`fieldgate_bridge_dead_letters{bridge="cloud"}`); n != 3 {
		t.Errorf("fieldgate_bridge_dead_letters = %v, want 3", n)
	}
	if code, page := opsGet(t, "http://"+g.opsAddr, "/", "", ""); code != 200 || !strings.Contains(page, `<span class="dead">3</span> dead letters`) || !strings.Contains(page, "up/dead-3") {
		t.Errorf("the status page (%d) does not show the dead letters:\n%s", code, page)
	}

	post := func(action string, form url.Values, token string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, "http://"+g.opsAddr+"/bridges/cloud/dead-letters/"+action, strings.NewReader(form.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		return opsDo(t, req)
	}
	if code, body := post("retry", url.Values{"seq": {"2"}}, ""); code != 401 {
		t.Errorf("retry without the token = %d %q, want 401", code, body)
	}
	if code, body := post("retry", url.Values{"seq": {"2", "99"}}, deadOpsToken); code != 404 || !strings.Contains(body, "99") {
		t.Errorf("retry of an unknown dead letter = %d %q, want 404 naming it", code, body)
	}
	if code, body := post("retry", url.Values{"seq": {"2"}}, deadOpsToken); code != 200 || !strings.Contains(body, "retried 1") {
		t.Fatalf("retry 2 = %d %q", code, body)
	}
	awaitUpstream(t, cloud, "up/dead-2", "reading 2")

	// The command finds the file held and asks the running gateway.
	fg := func(args ...string) (string, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
		defer cancel()
		out, err := exec.CommandContext(ctx, bin, append([]string{"db", "deadletters"}, append(args, "-config", g.cfgPath)...)...).CombinedOutput()
		return string(out), err
	}
	out, err := fg("list")
	if err != nil || !strings.Contains(out, `"up/dead-1"`) || !strings.Contains(out, `"up/dead-3"`) || strings.Contains(out, "up/dead-2") {
		t.Errorf("db deadletters list on the running gateway: %v\n%s", err, out)
	}
	if out, err := fg("drop", "-bridge", "nowhere", "1"); err == nil || !strings.Contains(out, `no bridge is named "nowhere"`) {
		t.Errorf("drop on an unknown bridge: %v\n%s", err, out)
	}
	if out, err := fg("drop", "7"); err == nil || !strings.Contains(out, "404") || !strings.Contains(out, "no such dead letter: 7") {
		t.Errorf("drop of an unknown dead letter: %v\n%s", err, out)
	}
	if out, err := fg("drop", "1"); err != nil || !strings.Contains(out, "dropped 1 dead letters of bridge cloud") {
		t.Fatalf("db deadletters drop 1: %v\n%s", err, out)
	}
	if out, err := fg("retry", "-all"); err != nil || !strings.Contains(out, "retried 1 dead letters of bridge cloud") {
		t.Fatalf("db deadletters retry -all: %v\n%s", err, out)
	}
	awaitUpstream(t, cloud, "up/dead-3", "reading 3")
	g.awaitLog("dead letters dropped by a command")
	if n := g.metric(`fieldgate_bridge_dead_letters{bridge="cloud"}`); n != 0 {
		t.Errorf("fieldgate_bridge_dead_letters = %v after it all, want 0", n)
	}
	if n := g.metric(`fieldgate_bridge_messages_dropped_total{bridge="cloud",reason="dead_letter_dropped"}`); n != 1 {
		t.Errorf("dropped as dead_letter_dropped = %v, want 1", n)
	}

	g.stop()
	g.checkState()
	if out, err := fg("list"); err != nil || !strings.Contains(out, "no dead letters") {
		t.Errorf("db deadletters on the stopped gateway's file: %v\n%s", err, out)
	}
}

// awaitUpstream reads the cloud subscriber's messages until one on topic
// with payload comes, acknowledging each.
func awaitUpstream(t *testing.T, c *client, topic, payload string) {
	t.Helper()
	for {
		pk, err := c.read(ioTimeout)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("%s %q did not reach the upstream within %s", topic, payload, ioTimeout)
		}
		if err != nil {
			t.Fatal(err)
		}
		if pk.FixedHeader.Type != packets.Publish {
			continue
		}
		if pk.FixedHeader.Qos == 1 {
			_ = c.ack(packets.Puback, pk.PacketID)
		}
		if pk.TopicName == topic && string(pk.Payload) == payload {
			return
		}
	}
}
