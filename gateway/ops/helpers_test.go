package ops

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
)

// epoch is the fake gateway's "now": fixed, so ages on the page are known.
var epoch = time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC)

// setCall is one call of Sources.SetOutput.
type setCall struct {
	name string
	on   bool
}

// fakeGateway backs Sources with figures a test knows and can change.
type fakeGateway struct {
	mu       sync.Mutex
	ready    bool
	why      string
	outputs  []Output
	sensors  []Sensor
	bridges  []Bridge
	calls    []setCall
	switched chan setCall // receives every SetOutput call, if not nil
	setErr   error
	dead     map[string][]DeadLetter // by bridge, oldest first
	deadErr  error                   // what retry and drop fail with, if not nil
}

func newFakeGateway() *fakeGateway {
	return &fakeGateway{
		ready:   true,
		outputs: []Output{{Name: "pump", On: false}, {Name: "fan", On: true}},
		sensors: []Sensor{
			{
				Name: "bench", Kind: "bme280", OK: true, Since: epoch.Add(-2 * time.Hour),
				Reads: 360, Failures: map[string]uint64{"timeout": 2, "crc": 1},
				Values: []Value{
					{Quantity: "temperature", Unit: "°C", Value: 21.5},
					{Quantity: "humidity", Unit: "%", Value: 48.25},
					{Quantity: "pressure", Unit: "hPa", Value: 1013.2},
				},
				LastRead: epoch.Add(-5 * time.Second),
			},
			{
				Name: "tank", Kind: "ads1115", OK: false, Since: epoch.Add(-10 * time.Minute),
				LastError: "i2c: no ACK from 0x48", Reads: 12, Failures: map[string]uint64{"no_device": 12},
				Values:   []Value{{Quantity: "level", Unit: "bar", Value: 1.75}},
				LastRead: epoch.Add(-11 * time.Minute),
			},
		},
		bridges: []Bridge{
			{
				Name: "cloud", State: "connected", Since: epoch.Add(-30 * time.Minute), Protocol: 5,
				Depth: 12, Bytes: 3456, OldestAge: 90 * time.Second, Sent: 100, Acked: 95, Inbound: 3,
				Reconnects: 2, Dropped: map[string]uint64{"full": 4, "expired": 1, "dead_letter_full": 1}, Window: 32,
				DeadLetters: 4, DeadLetterBytes: 900, DeadLettered: 5, QoSLimit: 2,
			},
			{Name: "backup", State: "down", Since: epoch.Add(-time.Hour), LastError: "dial tcp 10.0.0.9:8883: connection refused",
				Protocol: 4, Failing: 6, QoSLimit: 1},
		},
		dead: map[string][]DeadLetter{"cloud": {
			{Seq: 2, Topic: "sites/gw1/old", Reason: "gone", At: epoch.Add(-3 * time.Hour), QoS: 1, Payload: []byte("0")},
			{Seq: 3, Topic: "sites/gw1/bad topic", Reason: "server closed the link: invalid subject", At: epoch.Add(-2 * time.Hour), Failures: 3, QoS: 1, Payload: []byte("21.5")},
			{Seq: 7, Topic: "sites/gw1/<b>", Reason: "0x99 payload format invalid", At: epoch.Add(-90 * time.Second), Failures: 3, QoS: 2, Payload: []byte{0xff, 0}},
			{Seq: 8, Topic: "sites/gw1/x", Reason: "refused", At: epoch.Add(-30 * time.Second), Failures: 3, QoS: 1, Payload: []byte("x")},
		}},
	}
}

// deadLetters is the fake's Sources.DeadLetters: the newest limit.
func (f *fakeGateway) deadLetters(bridge string, limit int) ([]DeadLetter, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.ContainsFunc(f.bridges, func(b Bridge) bool { return b.Name == bridge }) {
		return nil, fmt.Errorf("%w: no bridge %q", ErrNotFound, bridge)
	}
	list := f.dead[bridge]
	if limit > 0 && len(list) > limit {
		list = list[len(list)-limit:]
	}
	return slices.Clone(list), nil
}

// actOnDead is the fake's retry and drop: it takes the dead letters
// named (none: all) away, after checking every one exists.
func (f *fakeGateway) actOnDead(bridge string, seqs []uint64) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.deadErr != nil {
		return 0, f.deadErr
	}
	list := f.dead[bridge]
	for _, seq := range seqs {
		if !slices.ContainsFunc(list, func(d DeadLetter) bool { return d.Seq == seq }) {
			return 0, fmt.Errorf("%w: bridge %s has no dead letter %d", ErrNotFound, bridge, seq)
		}
	}
	if len(seqs) == 0 {
		f.dead[bridge] = nil
		return len(list), nil
	}
	f.dead[bridge] = slices.DeleteFunc(list, func(d DeadLetter) bool { return slices.Contains(seqs, d.Seq) })
	return len(seqs), nil
}

func (f *fakeGateway) sources() Sources {
	return Sources{
		Identity: func() Identity {
			return Identity{Name: "greenhouse-1", Version: "1.2.3", Started: epoch.Add(-(3*time.Hour + 25*time.Minute))}
		},
		Broker: func() BrokerStats {
			return BrokerStats{Connected: 3, Sessions: 5, Connections: 42, MsgsReceived: 1000, MsgsSent: 2000,
				BytesReceived: 123456, BytesSent: 654321, Dropped: 7, Refused: 2, Subscriptions: 11, Retained: 4}
		},
		Clients: func() []Client {
			return []Client{
				{ID: "plc-1", User: "plc", Listener: "default", Remote: "192.168.1.20:50000", V5: true},
				{ID: "dash", Listener: "ws", Remote: "10.0.0.5:4444"},
			}
		},
		Sensors: func() []Sensor {
			f.mu.Lock()
			defer f.mu.Unlock()
			out := append([]Sensor(nil), f.sensors...)
			for i := range out {
				out[i].Values = append([]Value(nil), out[i].Values...)
			}
			return out
		},
		Outputs: func() []Output {
			f.mu.Lock()
			defer f.mu.Unlock()
			return append([]Output(nil), f.outputs...)
		},
		Bridges: func() []Bridge {
			f.mu.Lock()
			defer f.mu.Unlock()
			return append([]Bridge(nil), f.bridges...)
		},
		Storage: func() StorageStats {
			return StorageStats{FileBytes: 1<<20 + 12345, Commits: 500, CommitTime: 2500 * time.Millisecond, Failures: 1, LazyLost: 3}
		},
		Ready: func() (bool, string) {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.ready, f.why
		},
		SetOutput:        f.setOutput,
		DeadLetters:      f.deadLetters,
		RetryDeadLetters: f.actOnDead,
		DropDeadLetters:  f.actOnDead,
	}
}

func (f *fakeGateway) setOutput(name string, on bool) error {
	f.mu.Lock()
	if f.setErr != nil {
		f.mu.Unlock()
		return f.setErr
	}
	found := false
	for i := range f.outputs {
		if f.outputs[i].Name == name {
			f.outputs[i].On, found = on, true
		}
	}
	f.calls = append(f.calls, setCall{name, on})
	ch := f.switched
	f.mu.Unlock()
	if !found {
		return errors.New("no such output")
	}
	if ch != nil {
		ch <- setCall{name, on}
	}
	return nil
}

func (f *fakeGateway) setCalls() []setCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]setCall(nil), f.calls...)
}

// testLogger sends the server's log to the test's log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// startServer starts a server for src on addr (127.0.0.1:0 when empty)
// with the clock at epoch, shuts it down at the end of the test, and
// returns it with its base URL.
func startServer(t *testing.T, addr string, src Sources) (*Server, string) {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	s := New(addr, src, testLogger(t))
	s.now = func() time.Time { return epoch }
	if err := s.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testkit.Scale(5*time.Second))
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return s, "http://" + s.Addr().String()
}

// get fetches url and returns the response with its body read.
func get(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return do(t, req)
}

func do(t *testing.T, req *http.Request) (*http.Response, string) {
	t.Helper()
	client := &http.Client{
		Timeout: 10 * time.Second,
		// The switch answers a browser with a redirect; tests look at it.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", req.Method, req.URL, err)
	}
	return resp, string(body)
}
