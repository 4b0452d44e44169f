package brokerbench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// startMochi runs mochi's broker in the test process on a free loopback
// port and returns its address.
func startMochi(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	srv := mqtt.New(&mqtt.Options{Logger: slog.New(slog.DiscardHandler)})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		t.Fatal(err)
	}
	if err := srv.AddListener(listeners.NewTCP(listeners.Config{ID: "test", Address: addr})); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return addr
}

func TestPublishPacket(t *testing.T) {
	for _, qos := range []byte{0, 1} {
		p, err := newPublishPacket("bench/7", qos, 16)
		if err != nil {
			t.Fatal(err)
		}
		if qos > 0 {
			p.setID(0x1234)
		}
		copy(p.payload(), "stamp")

		var pk packets.Packet
		c := &Conn{r: bufioReader(p.b)}
		if err := c.Read(&pk); err != nil {
			t.Fatalf("qos %d: decoding the template: %v", qos, err)
		}
		if pk.TopicName != "bench/7" || pk.FixedHeader.Qos != qos || len(pk.Payload) != 16 || !bytes.HasPrefix(pk.Payload, []byte("stamp")) {
			t.Errorf("qos %d: decoded topic %q qos %d payload %q", qos, pk.TopicName, pk.FixedHeader.Qos, pk.Payload)
		}
		if qos > 0 && pk.PacketID != 0x1234 {
			t.Errorf("qos %d: packet id %#x, want 0x1234", qos, pk.PacketID)
		}
	}
}

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }

func TestSubscribeRefused(t *testing.T) {
	addr := startMochi(t)
	ctx := context.Background()
	c, err := Dial(ctx, addr, Options{ClientID: "refused"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// "#" must be the last level [MQTT-4.7.1-2].
	err = c.Subscribe(ctx, []string{"ok/+", "bad/#/x"}, 0, nil)
	if !errors.Is(err, ErrSubRefused) || !strings.Contains(err.Error(), "bad/#/x") {
		t.Errorf("Subscribe = %v, want ErrSubRefused naming bad/#/x", err)
	}
}

func TestProbeNoBroker(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close() // accepts TCP, never answers CONNECT
	err = Probe(context.Background(), l.Addr().String(), 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "no CONNACK") {
		t.Errorf("Probe = %v, want a no-CONNACK error", err)
	}
}

// TestScenarios runs every scenario, scaled down, against mochi in this
// process, and checks each reports its figures.
func TestScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a broker for a few seconds")
	}
	cfg := DefaultConfig()
	cfg.Broker, cfg.Addr, cfg.PID = "mochi", startMochi(t), os.Getpid()
	cfg.Warmup, cfg.Duration = 50*time.Millisecond, 200*time.Millisecond
	cfg.Pairs, cfg.FanOut, cfg.Rate = 2, 5, 200
	cfg.Conns, cfg.Subs, cfg.SubConns = 20, 300, 4
	cfg.Settle = 100 * time.Millisecond

	want := map[string][]string{
		"throughput": {"msgs/s", "sent/s"},
		"latency":    {"p50-us", "p90-us", "p99-us", "max-us", "msgs/s"},
		"idle":       {"rss-B/conn", "heap-B/conn", "rss-base-MiB", "rss-MiB", "conns/s"},
		"subs":       {"rss-B/sub", "heap-B/sub", "rss-base-MiB", "rss-MiB", "subs/s"},
	}
	for _, s := range Scenarios(&cfg) {
		t.Run(s.Name, func(t *testing.T) {
			res, err := s.Run(context.Background(), &cfg)
			if err != nil {
				t.Fatal(err)
			}
			units := checkUnits(t, res, want[s.Group], nil)
			if v, ok := units["msgs/s"]; ok && v <= 0 {
				t.Errorf("msgs/s = %v", v)
			}
			var out bytes.Buffer
			if err := res.Write(&out); err != nil {
				t.Fatal(err)
			}
			if line := out.String(); !strings.HasPrefix(line, benchPrefix+"mochi/"+s.Name+" 1 ") {
				t.Errorf("result line %q", line)
			}
		})
	}
}

func TestSelect(t *testing.T) {
	cfg := DefaultConfig()
	all := Scenarios(&cfg)
	for _, tc := range []struct {
		list    string
		want    []string
		wantErr bool
	}{
		{list: "latency", want: []string{"latency-qos0-10x10-1000mps", "latency-qos1-10x10-1000mps"}},
		{list: "qos1-1x1000,idle", want: []string{"qos1-1x1000", "idle-10000conns-5subs"}},
		{list: "subs,subs", want: []string{"subs-100conns-100000subs"}},
		{list: "", want: names(all)},
		{list: "nonesuch", wantErr: true},
	} {
		got, err := Select(all, tc.list)
		if (err != nil) != tc.wantErr {
			t.Errorf("Select(%q) error %v", tc.list, err)
			continue
		}
		if !slices.Equal(names(got), tc.want) {
			t.Errorf("Select(%q) = %q, want %q", tc.list, names(got), tc.want)
		}
	}
}

// checkUnits reports every unit of want that res lacks and every unit of
// wantNot that it has, and returns res's figures by unit.
func checkUnits(t *testing.T, res Result, want, wantNot []string) map[string]float64 {
	t.Helper()
	if len(res.Notes) > 0 {
		t.Errorf("notes: %q", res.Notes)
	}
	units := map[string]float64{}
	for _, m := range res.Metrics {
		units[m.Unit] = m.Value
	}
	for _, u := range want {
		if _, ok := units[u]; !ok {
			t.Errorf("no %s in %+v", u, res.Metrics)
		}
	}
	for _, u := range wantNot {
		if _, ok := units[u]; ok {
			t.Errorf("%s in %+v", u, res.Metrics)
		}
	}
	return units
}

func names(ss []Scenario) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.Name)
	}
	return out
}
