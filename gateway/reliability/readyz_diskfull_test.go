package reliability

import (
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/mochi-mqtt/server/v2/packets"
)

// TestReadyzOnFullDisk runs the gateway with its state file on a small
// file system, fills it, and publishes retained QoS 1 messages, whose
// commits fail: /readyz must say not ready while they do, and ready again
// once a commit succeeds after room is freed.
func TestReadyzOnFullDisk(t *testing.T) {
	fs := testkit.SmallTmpfs(t, "2m")
	bin := buildGateway(t, t.TempDir())
	state := filepath.Join(fs, "state.db")
	g := newGatewayYAML(t, bin, strings.Replace(plainYAML(""), "%STATE%", strconv.Quote(state), 1))
	g.start()
	if code, body := readyz(t, g); code != http.StatusOK {
		t.Fatalf("/readyz at start = %d %q", code, body)
	}

	filler := filepath.Join(fs, "filler")
	fillDisk(t, filler)
	c, _, err := dial(g.addr, "diskfull", true, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	payload := strings.Repeat("x", 64<<10)
	pid := uint16(0)
	// publish sends a retained QoS 1 message and returns its PUBACK's
	// reason code.
	publish := func(topic string) byte {
		t.Helper()
		pid++
		err := c.write(&packets.Packet{
			FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Retain: true},
			TopicName:   topic, Payload: []byte(payload), PacketID: pid,
		})
		if err != nil {
			t.Fatal(err)
		}
		ack, err := c.read(ioTimeout)
		if err != nil || ack.FixedHeader.Type != packets.Puback {
			t.Fatalf("waiting for PUBACK: %v %v", ack, err)
		}
		return ack.ReasonCode
	}
	failed := false
	for i := range 64 {
		if publish("full/"+strconv.Itoa(i)) != 0 {
			failed = true
			break
		}
	}
	if !failed {
		t.Fatal("no publish was refused on a full disk")
	}
	code, body := readyz(t, g)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "state database") {
		t.Errorf("/readyz while commits fail = %d %q, want 503 naming the state database", code, body)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	// Room again: the next commit works, and the gateway is ready.
	var again byte = 0xff
	testkit.WaitFor(t, 10*time.Second, "a publish accepted once room is freed", func() bool {
		again = publish("full/again")
		return again == 0
	})
	if code, body := readyz(t, g); code != http.StatusOK {
		t.Errorf("/readyz after a commit succeeded = %d %q, want 200", code, body)
	}
}

// fillDisk writes path until its file system is full.
func fillDisk(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for len(buf) > 0 {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			buf = buf[:len(buf)/2]
		}
	}
}

// readyz returns /readyz's status and body.
func readyz(t *testing.T, g *gateway) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + g.opsAddr + "/readyz")
	if err != nil {
		t.Fatalf("GET /readyz: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
