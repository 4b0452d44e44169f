// Package natscluster runs a cluster of real NATS servers with JetStream
// and the MQTT listener as the upstream a test's bridge connects to: the
// distributed engine beside Mosquitto (package mosquitto), with what
// such a cloud broker does differently. NATS speaks MQTT 3.1.1 only and
// refuses an MQTT 5 CONNECT; it can refuse QoS 2 PUBLISH packets
// (Config.RejectQoS2Publish) and refuses topics that make no NATS subject
// (a space, say) by closing the connection.
//
// Start writes a configuration for each node in the test's directory (the
// nodes routed to each other, JetStream stored in the test's directory,
// its MQTT streams replicated on every node), starts them on free
// loopback ports, and returns once every node reports JetStream healthy
// and accepts an MQTT CONNECT. A Node can be SIGKILLed and started again
// on its store, as a machine of a cloud cluster fails. Consume reads a
// stream of the cluster through the natsstream command.
//
// The server and the reader are built from their own module
// (scripts/testtools), so that the firmware's module never depends on
// NATS: `make test` builds them into bin/testtools, and the kit builds
// them there itself when they are missing or stale, failing the test
// (never skipping it) when that fails.
package natscluster

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/internal/testkit"
)

// Timeouts before the time scale. A node's start covers JetStream's
// recovery of its store and the election of a leader for each of the
// MQTT streams; only a node that hangs takes this long.
const (
	startWait = 60 * time.Second
	stopWait  = 20 * time.Second
	// probeWait bounds one MQTT CONNECT of the readiness probe: NATS
	// answers it only once the account's MQTT streams have leaders.
	probeWait = 10 * time.Second
)

// MQTT5Refusal is in the line a node logs for each MQTT 5 CONNECT it
// refuses.
const MQTT5Refusal = "unacceptable protocol version of 5"

// Config selects what the cluster runs with.
type Config struct {
	Nodes             int  // how many nodes; 0: 3, the smallest cluster that keeps a quorum with one node down; 1: a single server, not clustered
	RejectQoS2Publish bool // mqtt { reject_qos2_publish: true }: a QoS 2 PUBLISH closes the connection
}

// Cluster is a running NATS cluster for one test.
type Cluster struct {
	t     testing.TB
	cfg   Config
	bin   string
	dir   string
	nodes []*Node
}

// Node is one server of the cluster, on fixed ports and a store that
// outlive its restarts.
type Node struct {
	c       *Cluster
	name    string
	client  string // host:port of the NATS client listener
	route   string // host:port of the cluster listener
	mqtt    string // host:port of the MQTT listener
	monitor string // host:port of the HTTP monitoring endpoint
	conf    string
	logPath string
	starts  int
	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has been reaped
}

// Start starts a cluster as cfg asks, waits until every node is ready,
// and stops it when the test ends; a failed test's log gets each node's
// configuration and the end of its log.
func Start(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	if cfg.Nodes == 0 {
		cfg.Nodes = 3
	}
	c := &Cluster{t: t, cfg: cfg, bin: tool(t, serverTool), dir: t.TempDir()}
	for i := range cfg.Nodes {
		n := &Node{
			c: c, name: fmt.Sprintf("n%d", i),
			client: testkit.FreeAddr(t), route: testkit.FreeAddr(t),
			mqtt: testkit.FreeAddr(t), monitor: testkit.FreeAddr(t),
		}
		n.conf = filepath.Join(c.dir, n.name+".conf")
		n.logPath = filepath.Join(c.dir, n.name+".log")
		c.nodes = append(c.nodes, n)
	}
	for _, n := range c.nodes {
		if err := os.WriteFile(n.conf, []byte(c.config(n)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			n.Kill()
		}
		if t.Failed() {
			for _, n := range c.nodes {
				b, _ := os.ReadFile(n.conf)
				t.Logf("NATS node %s configuration:\n%s\nlast lines of its log:\n%s", n.name, b, lastLines(n.Log(), 40))
			}
		}
	})
	// A JetStream cluster elects its meta leader only once a quorum of
	// nodes is up: start them all, then wait for each.
	for _, n := range c.nodes {
		n.spawn()
	}
	for _, n := range c.nodes {
		n.awaitReady()
	}
	return c
}

// config is node n's configuration file.
func (c *Cluster) config(n *Node) string {
	var b strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	line("server_name: %s", n.name)
	line("listen: %q", n.client)
	line("http: %q", n.monitor)
	line("jetstream {")
	line("  store_dir: %q", filepath.Join(c.dir, n.name+"-store"))
	// Far above what a test stores, far below the machine.
	line("  max_memory_store: 64MB")
	line("  max_file_store: 4GB")
	line("}")
	if len(c.nodes) > 1 {
		line("cluster {")
		line("  name: fieldgate-test")
		line("  listen: %q", n.route)
		var routes []string
		for _, o := range c.nodes {
			if o != n {
				routes = append(routes, fmt.Sprintf("%q", "nats-route://"+o.route))
			}
		}
		line("  routes: [%s]", strings.Join(routes, ", "))
		line("}")
	}
	line("mqtt {")
	line("  listen: %q", n.mqtt)
	// Every MQTT stream (sessions, messages, QoS 2 flights, retained) on
	// every node: a node's loss keeps a quorum of each.
	line("  stream_replicas: %d", len(c.nodes))
	if c.cfg.RejectQoS2Publish {
		line("  reject_qos2_publish: true")
	}
	line("}")
	return b.String()
}

// Node returns node i.
func (c *Cluster) Node(i int) *Node { return c.nodes[i] }

// Nodes returns the cluster's nodes.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// ClientURLs returns every node's NATS client URL, comma-separated, for a
// NATS client that should find whichever node is up.
func (c *Cluster) ClientURLs() string {
	var urls []string
	for _, n := range c.nodes {
		urls = append(urls, "nats://"+n.client)
	}
	return strings.Join(urls, ",")
}

// CountLog returns how many lines of the nodes' logs, over all their
// starts, contain text.
func (c *Cluster) CountLog(text string) int {
	total := 0
	for _, n := range c.nodes {
		total += strings.Count(n.Log(), text)
	}
	return total
}

// LogLines returns the lines of the nodes' logs that contain text, each
// prefixed by its node's name.
func (c *Cluster) LogLines(text string) []string {
	var out []string
	for _, n := range c.nodes {
		for _, l := range strings.Split(n.Log(), "\n") {
			if strings.Contains(l, text) {
				out = append(out, n.name+": "+l)
			}
		}
	}
	return out
}

// Name returns the node's server_name.
func (n *Node) Name() string { return n.name }

// MQTTAddr returns the host:port of the node's MQTT listener.
func (n *Node) MQTTAddr() string { return n.mqtt }

// Log returns what the node has logged over all its starts.
func (n *Node) Log() string {
	b, err := os.ReadFile(n.logPath)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// Kill ends the node with SIGKILL, as a machine that loses power, and
// waits until it is reaped. It does nothing when the node is not running.
func (n *Node) Kill() {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.cmd = nil
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	select {
	case <-exited:
	case <-time.After(testkit.Scale(stopWait)):
		n.c.t.Errorf("NATS node %s not reaped %s after SIGKILL", n.name, testkit.Scale(stopWait))
	}
	n.note("--- killed: %v", cmd.ProcessState)
}

// Start starts the node again after Kill, on the same ports and store, and
// waits until it is ready.
func (n *Node) Start() {
	n.c.t.Helper()
	n.spawn()
	n.awaitReady()
}

// note appends a line to the node's log, between the server's own.
func (n *Node) note(format string, args ...any) {
	f, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	fmt.Fprintf(f, format+"\n", args...)
	f.Close()
}

// spawn starts the node's process.
func (n *Node) spawn() {
	t := n.c.t
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		t.Fatalf("NATS node %s is already running", n.name)
	}
	n.starts++
	out, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close() // the child has its own descriptor
	fmt.Fprintf(out, "--- start %d\n", n.starts)
	cmd := exec.Command(n.c.bin, "-c", n.conf)
	cmd.Stdout, cmd.Stderr = out, out
	configureProc(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting NATS node %s: %v", n.name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	n.cmd, n.exited = cmd, exited
}

// awaitReady waits until the node reports JetStream healthy (its meta
// leader known, its streams and consumers current) and accepts an MQTT
// CONNECT, which NATS answers only once the MQTT streams have leaders.
func (n *Node) awaitReady() {
	t := n.c.t
	t.Helper()
	limit := testkit.Scale(startWait)
	deadline := time.Now().Add(limit)
	n.mu.Lock()
	exited := n.exited
	n.mu.Unlock()
	var why error
	for _, ready := range []func() error{n.healthy, n.mqttReady} {
		for {
			if why = ready(); why == nil {
				break
			}
			select {
			case <-exited:
				t.Fatalf("NATS node %s exited at start %d; its log:\n%s", n.name, n.starts, lastLines(n.Log(), 40))
			case <-time.After(50 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("NATS node %s not ready %s after start %d: %v", n.name, limit, n.starts, why)
			}
		}
	}
	n.note("--- ready")
}

// healthy asks the monitoring endpoint's /healthz.
func (n *Node) healthy() error {
	client := &http.Client{Timeout: testkit.Scale(probeWait)}
	resp, err := client.Get("http://" + n.monitor + "/healthz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var body [512]byte
		k, _ := resp.Body.Read(body[:])
		return fmt.Errorf("/healthz: %s %s", resp.Status, strings.TrimSpace(string(body[:k])))
	}
	return nil
}

// mqttReady connects with MQTT 3.1.1 and a clean session, and
// disconnects.
func (n *Node) mqttReady() error {
	wait := testkit.Scale(probeWait)
	nc, err := net.DialTimeout("tcp", n.mqtt, wait)
	if err != nil {
		return err
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(wait))
	connect, err := mqttwire.Encode(&packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		ProtocolVersion: 4,
		Connect: packets.ConnectParams{
			ProtocolName:     []byte("MQTT"),
			ClientIdentifier: "natscluster-probe-" + n.name, Clean: true, Keepalive: 30,
		},
	})
	if err != nil {
		return err
	}
	if _, err := nc.Write(connect); err != nil {
		return err
	}
	fh, body, err := mqttwire.ReadPacket(bufio.NewReader(nc), 0, nil)
	if err != nil {
		return fmt.Errorf("MQTT CONNECT: %w", err)
	}
	if fh.Type != packets.Connack || len(body) != 2 || body[1] != 0 {
		return fmt.Errorf("MQTT CONNECT answered with %s %x", mqttwire.PacketName(fh.Type), body)
	}
	disconnect, _ := mqttwire.Encode(&packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}, ProtocolVersion: 4})
	_, _ = nc.Write(disconnect)
	return nil
}

// PID returns the running node's process id, for its CPU and memory; 0
// when it is not running.
func (n *Node) PID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

// lastLines returns the last k lines of s.
func lastLines(s string, k int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > k {
		lines = lines[len(lines)-k:]
	}
	return strings.Join(lines, "\n")
}
