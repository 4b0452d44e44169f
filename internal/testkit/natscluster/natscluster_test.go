package natscluster

import (
	"bufio"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/internal/testkit"
)

// publish sends n numbered QoS 1 messages to topic through the MQTT
// listener at addr, waiting for each PUBACK. Right after a node's loss
// NATS closes MQTT connections, or refuses them, until the streams that
// hold sessions and messages have elected new leaders: a message whose
// connection failed goes again on a new one, as a client library would
// send it again.
func publish(t *testing.T, addr, id, topic string, from, n int) {
	t.Helper()
	wait := testkit.Scale(probeWait)
	var c mqtt.Client
	defer func() {
		if c != nil {
			c.Disconnect(0)
		}
	}()
	for i := from; i < from+n; i++ {
		testkit.WaitFor(t, startWait, fmt.Sprintf("the PUBACK of message %d from %s", i, addr), func() bool {
			if c == nil {
				c = mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).
					SetProtocolVersion(4).SetAutoReconnect(false).SetConnectTimeout(wait))
				if tok := c.Connect(); !tok.WaitTimeout(wait) || tok.Error() != nil {
					c = nil
					return false
				}
			}
			if tok := c.Publish(topic, 1, false, strconv.Itoa(i)); !tok.WaitTimeout(wait) || tok.Error() != nil {
				c.Disconnect(0)
				c = nil
				return false
			}
			return true
		})
	}
}

// TestCluster starts a cluster, reads what MQTT publishers store in its
// message stream, kills a node and starts it again on its store: the
// stream keeps every acknowledged message, in the order published,
// through it. The order is the stream's sequence numbers', not the order
// the reader is given messages in: a consumer whose leader dies gives
// again, after its acknowledgement wait, what the old leader had sent
// and the reader never got, after later ones.
func TestCluster(t *testing.T) {
	c := Start(t, Config{RejectQoS2Publish: true})
	var mu sync.Mutex
	seqs := map[string][]uint64{} // payload → the sequence numbers it is stored under
	got := map[uint64]bool{}
	r := c.Consume(t, MQTTStream, "kit-test", MQTTSubject("kit/#"), func(m Message) {
		mu.Lock()
		defer mu.Unlock()
		if MQTTTopic(m.Subject) != "kit/a" {
			t.Errorf("message on %s, want kit/a", m.Subject)
		}
		if !got[m.Seq] {
			got[m.Seq] = true
			seqs[m.Data] = append(seqs[m.Data], m.Seq)
		}
	})
	publish(t, c.Node(1).MQTTAddr(), "kit-pub", "kit/a", 0, 50)
	c.Node(0).Kill()
	publish(t, c.Node(2).MQTTAddr(), "kit-pub", "kit/a", 50, 50)
	c.Node(0).Start()
	publish(t, c.Node(0).MQTTAddr(), "kit-pub", "kit/a", 100, 50)
	testkit.WaitFor(t, 30*time.Second, "150 messages in the stream", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seqs) == 150
	})
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	var last uint64
	for i := range 150 {
		s := seqs[strconv.Itoa(i)]
		if len(s) == 0 {
			t.Errorf("message %d missing", i)
			continue
		}
		first := slices.Min(s)
		if first < last {
			t.Errorf("message %d stored at sequence %d, before %d of the message published before it", i, first, last)
		}
		last = first
	}
	if n := c.CountLog(MQTT5Refusal); n != 0 {
		t.Errorf("%d MQTT 5 refusals logged before any MQTT 5 client came", n)
	}
}

// TestMQTT5Refused checks what the bridge's tests count on: NATS answers
// an MQTT 5 CONNECT with the 3.1.1 return code 1 (unacceptable protocol
// version) and logs one line for it.
func TestMQTT5Refused(t *testing.T) {
	c := Start(t, Config{Nodes: 1})
	wait := testkit.Scale(probeWait)
	nc, err := net.DialTimeout("tcp", c.Node(0).MQTTAddr(), wait)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(wait))
	connect, err := mqttwire.Encode(&packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		ProtocolVersion: 5,
		Connect:         packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: "v5", Clean: true, Keepalive: 30},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Write(connect); err != nil {
		t.Fatal(err)
	}
	fh, body, err := mqttwire.ReadPacket(bufio.NewReader(nc), 0, nil)
	if err != nil || fh.Type != packets.Connack || len(body) != 2 || body[1] != 1 {
		t.Fatalf("MQTT 5 CONNECT answered with %s %x, %v; want CONNACK return code 1", mqttwire.PacketName(fh.Type), body, err)
	}
	testkit.WaitFor(t, 10*time.Second, "NATS to log the refusal", func() bool {
		return c.CountLog(MQTT5Refusal) == 1
	})
	t.Log(c.LogLines(MQTT5Refusal))
}
