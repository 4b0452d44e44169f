package broker

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
)

// fuzzWait bounds how long a connection may take to end once its client
// has gone: the broker needs microseconds, so seconds mean it never will.
var fuzzWait = testkit.Scale(5 * time.Second)

// FuzzConnReader feeds arbitrary bytes to a connection's reader, as a
// client would send them, then closes the connection. The broker must not
// crash, must let go of the connection, and must then serve a well-behaved
// client. Each input gets a broker of its own, so that a failure
// reproduces from its input alone.
//
//	go test -run XXX -fuzz FuzzConnReader -fuzztime 30s ./gateway/broker
func FuzzConnReader(f *testing.F) {
	for _, seed := range fuzzSeeds() {
		f.Add(seed)
	}
	opts := Options{Config: DefaultConfig(), Version: "fuzz"}
	opts.AllowAnonymous = true
	opts.SysInterval = 0
	// Small, so that the fuzzer reaches the limit.
	opts.MaxPacketSize = 4096
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := New(opts, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), fuzzWait)
			defer cancel()
			if err := b.Shutdown(ctx); err != nil {
				t.Errorf("shutdown: %v", err)
			}
		}()

		client, served := fuzzConn(b)
		drained := make(chan struct{})
		go func() {
			_, _ = io.Copy(io.Discard, client)
			close(drained)
		}()
		// The broker may stop reading part way, and close.
		_ = client.SetWriteDeadline(time.Now().Add(fuzzWait))
		_, _ = client.Write(data)
		client.Close()
		select {
		case <-served:
		case <-time.After(fuzzWait):
			t.Fatalf("the connection was still served %v after its client closed; input % X", fuzzWait, data)
		}
		<-drained

		fuzzNormalClient(t, b)
	})
}

// fuzzConn serves one end of a pipe and returns the other; served closes
// when ServeConn returns.
func fuzzConn(b *Broker) (client net.Conn, served <-chan struct{}) {
	client, server := net.Pipe()
	done := make(chan struct{})
	go func() {
		b.ServeConn("fuzz", server)
		close(done)
	}()
	return client, done
}

// fuzzNormalClient connects, pings, subscribes, publishes to itself and
// disconnects, requiring every answer byte for byte.
func fuzzNormalClient(t *testing.T, b *Broker) {
	t.Helper()
	client, served := fuzzConn(b)
	defer client.Close()
	w := &wireConn{t: t, nc: client, r: bufio.NewReader(client)}
	w.send(wireConnect(4, wireClean, 0, "well-behaved"))
	w.expect([]byte{wireCONNACK, 2, 0, 0})
	w.send([]byte{wirePINGREQ, 0})
	w.expect([]byte{wirePINGRESP, 0})
	w.send(wireSubscribe(4, 1, "fuzz/#", 1))
	w.expect([]byte{wireSUBACK, 3, 0, 1, 1})
	w.send(wirePublish(4, 0, "fuzz/ok", 0, "still here"))
	w.expect(wirePublish(4, 0, "fuzz/ok", 0, "still here"))
	w.send([]byte{wireDISCONNECT, 0})
	select {
	case <-served:
	case <-time.After(fuzzWait):
		t.Fatal("a well-behaved client's DISCONNECT did not end its connection")
	}
}

// fuzzSeeds are whole conversations: valid ones at both protocol versions,
// so that the fuzzer starts past CONNECT, and every hostile input of
// malformed_test.go behind the CONNECT it needs.
func fuzzSeeds() [][]byte {
	join := func(pkts ...[]byte) []byte { return bytes.Join(pkts, nil) }
	seeds := [][]byte{
		// MQTT 3.1.1: every packet a client sends, at every QoS.
		join(
			wireConnect(4, wireClean, 30, "seed3"),
			wireSubscribe(4, 1, "s/#", 2),
			wireFrame(wireSUBSCRIBE, wireU16(2), wireStr("a/+"), []byte{0}, wireStr("#"), []byte{1}),
			wirePublish(4, 0, "s/0", 0, "zero"),
			wirePublish(4, 2, "s/1", 1, "one"),
			wirePublish(4, 4|1, "s/2", 2, "two"),
			[]byte{wirePUBREL, 2, 0, 2},
			[]byte{wirePUBACK, 2, 0, 1},
			[]byte{wirePUBREC, 2, 0, 2},
			[]byte{wirePUBCOMP, 2, 0, 2},
			wireFrame(wireUNSUBSCRIBE, wireU16(3), wireStr("a/+")),
			[]byte{wirePINGREQ, 0},
			[]byte{wireDISCONNECT, 0},
		),
		// MQTT 3.1.1 with a will, credentials and a persistent session.
		join(
			wireConnect(4, wireWill|wireWillQoS1|wireWillRetain|wireUser|wirePassword, 1, "seed3w",
				wireStr("w/t"), wireStr("bye"), wireStr("user"), wireStr("pass")),
			wirePublish(4, 2, "w/x", 9, "x"),
		),
		// MQTT 5: properties on CONNECT, PUBLISH and SUBSCRIBE.
		join(
			wireFrame(wireCONNECT, wireStr("MQTT"), []byte{5, wireClean, 0, 30},
				[]byte{11, 0x11, 0, 0, 0, 60, 0x21, 0, 10, 0x22, 0, 5}, wireStr("seed5")),
			wireFrame(wireSUBSCRIBE, wireU16(3), []byte{2, 0x0B, 7}, wireStr("s/#"), []byte{2 | 4 | 8 | 0x10}),
			wireFrame(wireSUBSCRIBE, wireU16(4), []byte{0}, wireStr("$share/g/s/+"), []byte{1}),
			wireFrame(wirePUBLISH|2, wireStr("s/1"), wireU16(1), []byte{10, 0x23, 0, 1, 0x01, 1, 0x02, 0, 0, 0, 60}, []byte("aliased")),
			wireFrame(wirePUBLISH|2, wireStr(""), wireU16(2), []byte{3, 0x23, 0, 1}, []byte("by alias")),
			wirePublish(5, 4, "s/2", 3, "two"),
			[]byte{wirePUBREL, 2, 0, 3},
			[]byte{wirePUBACK, 4, 0, 1, 0x10, 0},
			wireFrame(wireUNSUBSCRIBE, wireU16(5), []byte{0}, wireStr("s/#")),
			[]byte{wirePINGREQ, 0},
			[]byte{wireDISCONNECT, 2, 0x04, 0},
		),
		// MQTT 5 with a will that has properties.
		join(
			wireFrame(wireCONNECT, wireStr("MQTT"), []byte{5, wireWill | wireWillQoS2, 0, 5}, []byte{0}, wireStr("seed5w"),
				[]byte{5, 0x18, 0, 0, 0, 1}, wireStr("w/5"), wireStr("gone")),
			[]byte{wireDISCONNECT, 7, 0x00, 5, 0x11, 0, 0, 0, 0},
		),
		// The short MQTT 5 SUBSCRIBEs that panic the codec.
		join(wireConnect(5, wireClean, 0, "short"), []byte{wireSUBSCRIBE, 3, 0, 1, 0}),
		join(wireConnect(5, wireClean, 0, "short"), []byte{wireSUBSCRIBE, 6, 0, 1, 0, 0, 1, 'a'}),
		join(wireConnect(5, wireClean, 0, "short"), []byte{wireSUBSCRIBE, 0}),
	}
	for _, cs := range [][]malformedCase{malformedFirstCases, malformedV3Cases, malformedV5Cases} {
		for _, c := range cs {
			var seed []byte
			if c.level != 0 {
				seed = wireConnect(c.level, wireClean, 0, "hostile")
			}
			seeds = append(seeds, append(seed, c.send...))
		}
	}
	return seeds
}
