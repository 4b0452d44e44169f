package broker

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/matcher"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Concurrency, leak and robustness tests: storms of connections and of
// takeovers, clients that vanish mid-flow, subscriptions that change under
// traffic, shutdown under load, in-process clients closing with messages
// in flight. After each, what the broker started for its clients must be
// gone: goroutines, sessions, index entries and the connected count.

var (
	// stressWait bounds one wait for the broker during a storm: hundreds
	// of clients share two cores and the race detector.
	stressWait = testkit.Scale(10 * time.Second)
	// scenarioWait bounds a whole scenario; one still running then is
	// taken for a deadlock, and every goroutine's stack is printed.
	scenarioWait = testkit.Scale(20 * time.Second)
)

const (
	// goroutineSlack is how many goroutines above the starting count a
	// test tolerates once its clients have gone: runtime and timer
	// goroutines come and go, while a leak of one per client or per
	// takeover does not hide in it.
	goroutineSlack = 5
)

// goroutineDump returns the stack of every goroutine.
func goroutineDump() string {
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	return b.String()
}

// expectGoroutines waits for the number of goroutines to come back to
// base, within goroutineSlack, and fails the test with every stack if it
// does not.
func expectGoroutines(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(stressWait)
	for {
		n := runtime.NumGoroutine()
		if n <= base+goroutineSlack {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after %v, %d before the clients came:\n%s", n, stressWait, base, goroutineDump())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// bounded runs scenario on a goroutine of its own and fails the test if
// it returns an error, or if it has not returned within scenarioWait: a
// deadlock in the broker shows as a scenario that never ends.
func bounded(t *testing.T, scenario func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- scenario() }()
	timer := time.NewTimer(scenarioWait)
	defer timer.Stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-timer.C:
		t.Fatalf("scenario still running after %v; deadlocked?\n%s", scenarioWait, goroutineDump())
	}
}

// errList gathers the errors of many goroutines, keeping the first few.
type errList struct {
	mu    sync.Mutex
	first []error
	n     int
}

func (l *errList) add(err error) {
	if err == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	if len(l.first) < 8 {
		l.first = append(l.first, err)
	}
}

func (l *errList) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == 0 {
		return nil
	}
	return fmt.Errorf("%d failures; the first:\n%w", l.n, errors.Join(l.first...))
}

// holdings is what the broker keeps for its clients.
type holdings struct {
	sessions  int   // sessions by client id
	subs      int   // their subscriptions
	indexed   int   // subscriptions in the index: subs, unless some leaked
	connected int64 // the clients/connected figure of $SYS
	live      int   // network connections still served
}

func holdingsOf(b *Broker) holdings {
	b.mu.Lock()
	h := holdings{sessions: len(b.sessions), indexed: b.index.Len(), connected: b.stats.connected.Load()}
	for _, s := range b.sessions {
		s.mu.Lock()
		h.subs += len(s.subs)
		s.mu.Unlock()
	}
	b.mu.Unlock()
	b.lmu.Lock()
	h.live = len(b.live)
	b.lmu.Unlock()
	return h
}

// expectHoldings waits for the broker to hold exactly want: a connection
// ends on the broker's side some time after its client has gone.
func expectHoldings(t *testing.T, b *Broker, want holdings) {
	t.Helper()
	deadline := time.Now().Add(stressWait)
	for {
		got := holdingsOf(b)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("broker holds %+v, want %+v", got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stormClient is a raw MQTT client for stress tests. Unlike rawClient it
// may be driven from any goroutine, returns errors instead of failing the
// test, and its reader acknowledges the broker's QoS 1 and 2 deliveries,
// so that one client can subscribe and publish at once. Packets other
// than PUBLISH (and PUBREL, unless holdRel) go to its owner in order.
type stormClient struct {
	nc      net.Conn
	version byte
	// onPublish sees every PUBLISH on the reader goroutine and reports
	// whether to acknowledge it; nil acknowledges everything.
	onPublish func(*packets.Packet) bool
	holdRel   bool // hand PUBREL to the owner instead of answering PUBCOMP

	wmu  sync.Mutex // one writer at a time: the owner, and the reader's acknowledgements
	ctl  chan *packets.Packet
	stop chan struct{}
	done chan struct{} // closed when the reader has stopped
	err  error         // why the reader stopped; read after done
	once sync.Once
	pid  uint16 // the last packet identifier the owner used

	// goneWith is 1 + the reason code of the first DISCONNECT the
	// broker sent, 0 while none came.
	goneWith atomic.Int32
}

// newStormClient wraps a connected socket; set the hooks, then start.
func newStormClient(nc net.Conn, version byte) *stormClient {
	return &stormClient{
		nc:      nc,
		version: version,
		ctl:     make(chan *packets.Packet, 64),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
}

// dialStorm connects a socket to addr and starts a client on it.
func dialStorm(addr string, version byte, onPublish func(*packets.Packet) bool) (*stormClient, error) {
	nc, err := net.DialTimeout("tcp", addr, stressWait)
	if err != nil {
		return nil, err
	}
	c := newStormClient(nc, version)
	c.onPublish = onPublish
	c.start()
	return c, nil
}

func (c *stormClient) start() { go c.read() }

func (c *stormClient) read() {
	defer close(c.done)
	r := bufio.NewReader(c.nc)
	for {
		pk, err := readRawPacket(r, c.version)
		if err != nil {
			c.err = err
			return
		}
		switch pk.FixedHeader.Type {
		case packets.Publish:
			if c.onPublish != nil && !c.onPublish(pk) {
				continue
			}
			// A failed write shows as the end of the connection on
			// the next read.
			switch pk.FixedHeader.Qos {
			case 1:
				_ = c.send(rawAck(packets.Puback, pk.PacketID, 0))
			case 2:
				_ = c.send(rawAck(packets.Pubrec, pk.PacketID, 0))
			}
			continue
		case packets.Pubrel:
			if !c.holdRel {
				_ = c.send(rawAck(packets.Pubcomp, pk.PacketID, 0))
				continue
			}
		case packets.Disconnect:
			c.goneWith.CompareAndSwap(0, int32(pk.ReasonCode)+1)
		}
		select {
		case c.ctl <- pk:
		case <-c.stop:
			c.err = net.ErrClosed
			return
		}
	}
}

// send encodes pk in the client's version and writes it.
func (c *stormClient) send(pk *packets.Packet) error {
	pk.ProtocolVersion = c.version
	b, err := mqttwire.Encode(pk) // with the flags PUBREL and SUBSCRIBE must carry
	if err != nil {
		return fmt.Errorf("encode %s: %w", mqttwire.PacketName(pk.FixedHeader.Type), err)
	}
	return c.sendBytes(b)
}

func (c *stormClient) sendBytes(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.nc.SetWriteDeadline(time.Now().Add(stressWait))
	_, err := c.nc.Write(b)
	return err
}

// expect returns the next packet handed to the owner, failing unless it is
// of type kind with packet identifier pid (any, when pid is 0); with that
// error it returns the packet that came instead.
func (c *stormClient) expect(kind byte, pid uint16) (*packets.Packet, error) {
	timer := time.NewTimer(stressWait)
	defer timer.Stop()
	var pk *packets.Packet
	select {
	case pk = <-c.ctl:
	case <-c.done:
		select {
		case pk = <-c.ctl:
		default:
			return nil, fmt.Errorf("waiting for %s: connection ended: %w", mqttwire.PacketName(kind), c.err)
		}
	case <-timer.C:
		return nil, fmt.Errorf("no %s within %v", mqttwire.PacketName(kind), stressWait)
	}
	if pk.FixedHeader.Type != kind || (pid != 0 && pk.PacketID != pid) {
		return pk, fmt.Errorf("got %s, want %s id %d", rawDescribe(pk), mqttwire.PacketName(kind), pid)
	}
	return pk, nil
}

func (c *stormClient) nextPID() uint16 {
	c.pid++
	if c.pid == 0 {
		c.pid = 1
	}
	return c.pid
}

// connect sends CONNECT, changed by edit when not nil, and fails unless
// the broker accepts it.
func (c *stormClient) connect(id string, clean bool, edit func(*packets.Packet)) (*packets.Packet, error) {
	pk := &packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Connect},
		Connect:     packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: id, Clean: clean},
	}
	if edit != nil {
		edit(pk)
	}
	if err := c.send(pk); err != nil {
		return nil, fmt.Errorf("CONNECT %q: %w", id, err)
	}
	ack, err := c.expect(packets.Connack, 0)
	if err != nil {
		return nil, fmt.Errorf("CONNECT %q: %w", id, err)
	}
	if ack.ReasonCode != 0 {
		return ack, fmt.Errorf("CONNECT %q refused: %s", id, rawDescribe(ack))
	}
	return ack, nil
}

// subscribe subscribes to filters at qos and fails unless every one is
// granted qos.
func (c *stormClient) subscribe(qos byte, filters ...string) error {
	subs := make([]packets.Subscription, len(filters))
	for i, f := range filters {
		subs[i] = packets.Subscription{Filter: f, Qos: qos}
	}
	pk := rawSubscribe(c.nextPID(), subs...)
	if err := c.send(pk); err != nil {
		return err
	}
	ack, err := c.expect(packets.Suback, pk.PacketID)
	if err != nil {
		return fmt.Errorf("subscribe %q: %w", filters, err)
	}
	if len(ack.ReasonCodes) != len(filters) || slices.ContainsFunc(ack.ReasonCodes, func(code byte) bool { return code != qos }) {
		return fmt.Errorf("subscribe %q at QoS %d: %s", filters, qos, rawDescribe(ack))
	}
	return nil
}

func (c *stormClient) unsubscribe(filters ...string) error {
	pk := rawUnsubscribe(c.nextPID(), filters...)
	if err := c.send(pk); err != nil {
		return err
	}
	if _, err := c.expect(packets.Unsuback, pk.PacketID); err != nil {
		return fmt.Errorf("unsubscribe %q: %w", filters, err)
	}
	return nil
}

// publish publishes and completes the QoS flow.
func (c *stormClient) publish(topic string, payload []byte, qos byte) error {
	pk := &packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos}, TopicName: topic, Payload: payload}
	if qos > 0 {
		pk.PacketID = c.nextPID()
	}
	if err := c.send(pk); err != nil {
		return err
	}
	kind := byte(packets.Puback)
	if qos == 2 {
		kind = packets.Pubrec
	}
	if qos > 0 {
		ack, err := c.expect(kind, pk.PacketID)
		if err != nil {
			return fmt.Errorf("publish to %q: %w", topic, err)
		}
		if ack.ReasonCode != 0 {
			return fmt.Errorf("publish to %q: %s", topic, rawDescribe(ack))
		}
	}
	if qos == 2 {
		if err := c.send(rawAck(packets.Pubrel, pk.PacketID, 0)); err != nil {
			return err
		}
		if _, err := c.expect(packets.Pubcomp, pk.PacketID); err != nil {
			return fmt.Errorf("publish to %q: %w", topic, err)
		}
	}
	return nil
}

// burst sends n SUBSCRIBE and UNSUBSCRIBE packets for filters without
// waiting, then PINGREQ, and returns once PINGRESP has come.
func (c *stormClient) burst(n int, filters ...string) error {
	for i := range n {
		pk := rawUnsubscribe(c.nextPID(), filters...)
		if i%2 == 0 {
			pk = rawSubscribe(pk.PacketID)
			for _, f := range filters {
				pk.Filters = append(pk.Filters, packets.Subscription{Filter: f, Qos: byte(i % 3)})
			}
		}
		if err := c.send(pk); err != nil {
			return err
		}
	}
	if err := c.send(&packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}}); err != nil {
		return err
	}
	for {
		pk, err := c.expect(packets.Pingresp, 0)
		if err == nil {
			return nil
		}
		if pk == nil {
			return err
		}
	}
}

// ping returns once the broker has answered a PINGREQ: whatever it had
// queued for the client before reading it has been read.
func (c *stormClient) ping() error {
	if err := c.send(&packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}}); err != nil {
		return err
	}
	_, err := c.expect(packets.Pingresp, 0)
	return err
}

// disconnect sends DISCONNECT with code and waits for the broker to close
// the connection.
func (c *stormClient) disconnect(code byte) error {
	defer c.close()
	if err := c.send(&packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}, ReasonCode: code}); err != nil {
		return err
	}
	return c.waitClosed()
}

// close drops the connection without DISCONNECT, as a failing network
// would, and waits for the reader to stop. It may be called again.
func (c *stormClient) close() {
	c.once.Do(func() {
		close(c.stop)
		_ = c.nc.Close()
	})
	<-c.done
}

// reset drops the connection with a TCP reset rather than a close.
func (c *stormClient) reset() {
	if tc, ok := c.nc.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.close()
}

// waitClosed waits for the broker to close the connection, discarding
// what it sends meanwhile.
func (c *stormClient) waitClosed() error {
	timer := time.NewTimer(stressWait)
	defer timer.Stop()
	for {
		select {
		case <-c.ctl:
		case <-c.done:
			return nil
		case <-timer.C:
			return fmt.Errorf("connection still open after %v", stressWait)
		}
	}
}

// TestStressConnectionStorm: hundreds of clients, raw and Paho, MQTT 3.1.1
// and 5, connect at once, subscribe, publish to each other and go, most
// with DISCONNECT and the others by dropping the socket. Every message reaches
// every subscriber, and then the broker holds nothing for them: no
// session, no subscription, no goroutine, a connected count of zero.
func TestStressConnectionStorm(t *testing.T) {
	nRaw, nPaho5, nPaho3 := 200, 60, 40
	if testing.Short() {
		nRaw, nPaho5, nPaho3 = 60, 20, 20
	}
	n := nRaw + nPaho5 + nPaho3
	tb := startBroker(t, nil)
	base := runtime.NumGoroutine()

	// Client i subscribes to storm/<i%groups>/# and, once every client
	// has, publishes one QoS 1 message to the next group; so client i
	// receives one message from each client of the group before its own.
	const groups = 10
	members := make([]int, groups)
	for i := range n {
		members[i%groups]++
	}
	want := func(i int) int32 { return int32(members[(i+groups-1)%groups]) }
	filter := func(i int) string { return fmt.Sprintf("storm/%d/#", i%groups) }
	topic := func(i int) string { return fmt.Sprintf("storm/%d/%d", (i+1)%groups, i) }

	var ready sync.WaitGroup
	ready.Add(n)
	start := make(chan struct{})
	// waitStart reports whether the storm started before scenarioWait.
	waitStart := func() bool {
		select {
		case <-start:
			return true
		case <-time.After(scenarioWait):
			return false
		}
	}
	// counter counts client i's messages; full closes once all came.
	counter := func(i int) (count func(), got *atomic.Int32, full chan struct{}) {
		got, full = new(atomic.Int32), make(chan struct{})
		return func() {
			if got.Add(1) == want(i) {
				close(full)
			}
		}, got, full
	}
	waitFull := func(i int, got *atomic.Int32, full chan struct{}) error {
		select {
		case <-full:
			return nil
		case <-time.After(stressWait):
			return fmt.Errorf("client %d got %d of %d messages", i, got.Load(), want(i))
		}
	}

	rawOne := func(i int) error {
		done := sync.OnceFunc(ready.Done)
		defer done()
		count, got, full := counter(i)
		c, err := dialStorm(tb.Addr, byte(4+i/2%2), func(*packets.Packet) bool { count(); return true })
		if err != nil {
			return err
		}
		defer c.close()
		if _, err := c.connect(fmt.Sprintf("storm-%d", i), true, nil); err != nil {
			return err
		}
		if err := c.subscribe(1, filter(i)); err != nil {
			return err
		}
		done()
		if !waitStart() {
			return nil
		}
		if err := c.publish(topic(i), []byte("hello"), 1); err != nil {
			return err
		}
		if err := waitFull(i, got, full); err != nil {
			return err
		}
		if i%2 == 0 {
			return c.disconnect(0)
		}
		c.close()
		return nil
	}

	paho5One := func(i int) error {
		done := sync.OnceFunc(ready.Done)
		defer done()
		count, got, full := counter(i)
		nc, err := net.DialTimeout("tcp", tb.Addr, stressWait)
		if err != nil {
			return err
		}
		cl := paho.NewClient(paho.ClientConfig{
			Conn: nc,
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){
				func(paho.PublishReceived) (bool, error) { count(); return true, nil },
			},
			PacketTimeout: stressWait,
		})
		ctx, cancel := context.WithTimeout(context.Background(), scenarioWait)
		defer cancel()
		if _, err := cl.Connect(ctx, &paho.Connect{ClientID: fmt.Sprintf("storm-%d", i), CleanStart: true, KeepAlive: 30}); err != nil {
			nc.Close()
			return fmt.Errorf("paho connect %d: %w", i, err)
		}
		defer func() {
			if i%2 == 0 {
				_ = cl.Disconnect(&paho.Disconnect{})
				return
			}
			nc.Close()
			<-cl.Done()
		}()
		if _, err := cl.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter(i), QoS: 1}}}); err != nil {
			return fmt.Errorf("paho subscribe %d: %w", i, err)
		}
		done()
		if !waitStart() {
			return nil
		}
		if _, err := cl.Publish(ctx, &paho.Publish{Topic: topic(i), QoS: 1, Payload: []byte("hello")}); err != nil {
			return fmt.Errorf("paho publish %d: %w", i, err)
		}
		return waitFull(i, got, full)
	}

	paho3One := func(i int) error {
		done := sync.OnceFunc(ready.Done)
		defer done()
		count, got, full := counter(i)
		o := mqtt.NewClientOptions().
			AddBroker("tcp://" + tb.Addr).
			SetClientID(fmt.Sprintf("storm-%d", i)).
			SetProtocolVersion(4).
			SetCleanSession(true).
			SetAutoReconnect(false).
			SetConnectRetry(false).
			SetConnectTimeout(stressWait).
			SetWriteTimeout(stressWait).
			SetKeepAlive(30 * time.Second).
			SetDefaultPublishHandler(func(mqtt.Client, mqtt.Message) { count() })
		cl := mqtt.NewClient(o)
		wait := func(tok mqtt.Token, what string) error {
			if !tok.WaitTimeout(stressWait) {
				return fmt.Errorf("paho %d: no answer to %s", i, what)
			}
			if err := tok.Error(); err != nil {
				return fmt.Errorf("paho %d: %s: %w", i, what, err)
			}
			return nil
		}
		if err := wait(cl.Connect(), "connect"); err != nil {
			return err
		}
		// Always with DISCONNECT: this client's goroutines do not all end
		// when its socket is cut under it, and the raw and MQTT 5 clients
		// cover that.
		defer cl.Disconnect(0)
		if err := wait(cl.Subscribe(filter(i), 1, nil), "subscribe"); err != nil {
			return err
		}
		done()
		if !waitStart() {
			return nil
		}
		if err := wait(cl.Publish(topic(i), 1, false, "hello"), "publish"); err != nil {
			return err
		}
		return waitFull(i, got, full)
	}

	bounded(t, func() error {
		var errs errList
		var wg sync.WaitGroup
		for i := range n {
			client := rawOne
			switch {
			case i >= nRaw+nPaho5:
				client = paho3One
			case i >= nRaw:
				client = paho5One
			}
			wg.Go(func() { errs.add(client(i)) })
		}
		ready.Wait()
		close(start)
		wg.Wait()
		return errs.err()
	})
	expectHoldings(t, tb.Broker, holdings{})
	if got := tb.stats.totalConns.Load(); got != int64(n) {
		t.Errorf("total connections %d, want %d", got, n)
	}
	expectGoroutines(t, base)
}

// TestStressTakeover: workers connect with one client id over and over,
// MQTT 3.1.1 and 5, clean start on and off, some with wills, subscribing
// and publishing in between, each connection taking over the last. Every
// CONNECT is accepted, nothing deadlocks, and afterwards there is one
// session, its subscriptions all in the index, and no goroutine left over.
func TestStressTakeover(t *testing.T) {
	workers, rounds := 8, 100
	if testing.Short() {
		rounds = 30
	}
	tb := startBroker(t, nil)
	base := runtime.NumGoroutine()
	const id = "contested"
	var accepted atomic.Int64

	// round makes one connection and leaves it open for the next round to
	// close, or to be taken over meanwhile.
	round := func(rng *rand.Rand, prev *stormClient) (*stormClient, error) {
		version := byte(4 + rng.IntN(2))
		clean := rng.IntN(2) == 0
		c, err := dialStorm(tb.Addr, version, nil)
		if err != nil {
			return nil, err
		}
		_, err = c.connect(id, clean, func(pk *packets.Packet) {
			if version == 5 && rng.IntN(2) == 0 {
				pk.Properties.SessionExpiryInterval = 60
				pk.Properties.SessionExpiryIntervalFlag = true
			}
			if rng.IntN(2) == 0 {
				pk.Connect.WillFlag = true
				pk.Connect.WillTopic = "contested/will"
				pk.Connect.WillPayload = []byte("gone")
				pk.Connect.WillQos = byte(rng.IntN(3))
				if version == 5 {
					pk.Connect.WillProperties.WillDelayInterval = uint32(rng.IntN(2))
				}
			}
		})
		if prev != nil {
			prev.close()
		}
		if err != nil {
			c.close()
			return nil, err
		}
		accepted.Add(1)
		// Any of these may fail: another worker may take the session
		// over at any moment, which is what this test is for.
		for range rng.IntN(5) {
			switch rng.IntN(5) {
			case 4:
				// Pipelined, so that the broker is amid SUBSCRIBE
				// and UNSUBSCRIBE when the next takeover comes.
				err = c.burst(8, "contested/#", fmt.Sprintf("contested/%d", rng.IntN(4)))
			case 0:
				err = c.subscribe(byte(rng.IntN(3)), "contested/#", fmt.Sprintf("contested/%d", rng.IntN(4)))
			case 1:
				err = c.publish(fmt.Sprintf("contested/%d", rng.IntN(4)), []byte("x"), byte(rng.IntN(3)))
			case 2:
				err = c.unsubscribe("contested/#")
			default:
				err = c.ping()
			}
			if err != nil {
				break
			}
		}
		switch rng.IntN(4) {
		case 0:
			_ = c.disconnect(0)
		case 1:
			_ = c.disconnect(0x04) // with will in MQTT 5; a plain DISCONNECT in 3.1.1
		case 2:
			c.reset()
		}
		return c, nil
	}

	bounded(t, func() error {
		var errs errList
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
				var prev *stormClient
				for range rounds {
					c, err := round(rng, prev)
					errs.add(err)
					prev = c
				}
				if prev != nil {
					prev.close()
				}
			})
		}
		wg.Wait()
		return errs.err()
	})
	if got := accepted.Load(); got != int64(workers*rounds) {
		t.Fatalf("%d of %d CONNECTs accepted", got, workers*rounds)
	}

	// One last connection, persistent, settles who holds the session.
	last, err := dialStorm(tb.Addr, 5, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer last.close()
	if _, err := last.connect(id, false, func(pk *packets.Packet) {
		pk.Properties.SessionExpiryInterval = 60
		pk.Properties.SessionExpiryIntervalFlag = true
	}); err != nil {
		t.Fatal(err)
	}
	if err := last.subscribe(1, "contested/last"); err != nil {
		t.Fatal(err)
	}
	if err := last.ping(); err != nil {
		t.Fatal(err)
	}
	check := func(connected int64) {
		t.Helper()
		waitFor(t, func() bool {
			h := holdingsOf(tb.Broker)
			return h.connected == connected && int64(h.live) == connected
		}, "the connections to settle")
		h := holdingsOf(tb.Broker)
		if h.sessions != 1 || h.subs != h.indexed || h.subs == 0 {
			t.Fatalf("broker holds %+v, want one session with its subscriptions in the index", h)
		}
	}
	check(1)
	if err := last.disconnect(0); err != nil {
		t.Fatal(err)
	}
	check(0)
	expectGoroutines(t, base)
}

// TestStressAbruptClose: clients vanish at awkward moments: mid-packet,
// mid-CONNECT, right after CONNECT, halfway through QoS 2 flows either
// way, while the broker is writing a large fan-out to them, and while
// another connection takes their session over. Each will goes out
// exactly once when one is due and never otherwise, and nothing is left
// of the clients.
func TestStressAbruptClose(t *testing.T) {
	reps := 6
	if testing.Short() {
		reps = 2
	}
	tb := startBroker(t, nil)

	var wmu sync.Mutex
	wills := make(map[string]int)
	watcher := localConnect(t, tb.Broker, "will-watcher")
	if err := watcher.Subscribe("will/#", 1, func(m Message) {
		wmu.Lock()
		wills[string(m.Payload)]++
		wmu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	pusher, err := tb.Connect("pusher")
	if err != nil {
		t.Fatal(err)
	}
	base := runtime.NumGoroutine()

	withWill := func(id string) func(*packets.Packet) {
		return func(pk *packets.Packet) {
			pk.Connect.WillFlag = true
			pk.Connect.WillTopic = "will/" + id
			pk.Connect.WillPayload = []byte(id)
			pk.Connect.WillQos = 1
		}
	}
	connectPacket := func(version byte, id string) []byte {
		pk := &packets.Packet{
			FixedHeader:     packets.FixedHeader{Type: packets.Connect},
			ProtocolVersion: version,
			Connect:         packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: id, Clean: true},
		}
		withWill(id)(pk)
		var buf bytes.Buffer
		_ = pk.ConnectEncode(&buf)
		return buf.Bytes()
	}
	// connected dials and connects id with its will.
	connected := func(version byte, id string, onPublish func(*packets.Packet) bool) (*stormClient, error) {
		c, err := dialStorm(tb.Addr, version, onPublish)
		if err != nil {
			return nil, err
		}
		if _, err := c.connect(id, true, withWill(id)); err != nil {
			c.close()
			return nil, err
		}
		return c, nil
	}
	// qos2Out subscribes id at QoS 2 and has the pusher send it one
	// message; got sees the PUBLISH and says whether to answer PUBREC.
	qos2Out := func(version byte, id string, holdRel bool, got func(*packets.Packet) bool) (*stormClient, error) {
		nc, err := net.DialTimeout("tcp", tb.Addr, stressWait)
		if err != nil {
			return nil, err
		}
		c := newStormClient(nc, version)
		c.onPublish, c.holdRel = got, holdRel
		c.start()
		if _, err := c.connect(id, true, withWill(id)); err != nil {
			c.close()
			return nil, err
		}
		if err := c.subscribe(2, "q2/out/"+id); err != nil {
			c.close()
			return nil, err
		}
		return c, pusher.Publish(context.Background(), "q2/out/"+id, []byte("two"), 2, false)
	}

	// Each case drops one client and says how many wills it is due.
	cases := []struct {
		name string
		v5   bool // MQTT 5 only
		run  func(version byte, id string) (wills int, err error)
	}{
		{"mid-CONNECT", false, func(version byte, id string) (int, error) {
			nc, err := net.DialTimeout("tcp", tb.Addr, stressWait)
			if err != nil {
				return 0, err
			}
			b := connectPacket(version, id)
			_, err = nc.Write(b[:len(b)/2])
			nc.Close()
			return 0, err
		}},
		{"right after CONNECT", false, func(version byte, id string) (int, error) {
			nc, err := net.DialTimeout("tcp", tb.Addr, stressWait)
			if err != nil {
				return 0, err
			}
			_, err = nc.Write(connectPacket(version, id))
			nc.Close()
			return 1, err
		}},
		{"mid-PUBLISH", false, func(version byte, id string) (int, error) {
			c, err := connected(version, id, nil)
			if err != nil {
				return 0, err
			}
			// 100 bytes announced, 9 sent.
			err = c.sendBytes([]byte{0x30, 100, 0, 5, 'a', '/', 'b', '/', 'c'})
			c.close()
			return 1, err
		}},
		{"mid-length", false, func(version byte, id string) (int, error) {
			c, err := connected(version, id, nil)
			if err != nil {
				return 0, err
			}
			err = c.sendBytes([]byte{0x30, 0x80})
			c.reset()
			return 1, err
		}},
		{"QoS 2 in, no PUBREL", false, func(version byte, id string) (int, error) {
			c, err := connected(version, id, nil)
			if err != nil {
				return 0, err
			}
			defer c.close()
			if err := c.send(rawPublish("q2/in/"+id, "two", 2, false, 7)); err != nil {
				return 1, err
			}
			_, err = c.expect(packets.Pubrec, 7)
			return 1, err
		}},
		{"QoS 2 out, no PUBREC", false, func(version byte, id string) (int, error) {
			got := make(chan struct{}, 1)
			c, err := qos2Out(version, id, false, func(*packets.Packet) bool { got <- struct{}{}; return false })
			if c == nil {
				return 0, err
			}
			defer c.close()
			if err != nil {
				return 1, err
			}
			select {
			case <-got:
				return 1, nil
			case <-time.After(stressWait):
				return 1, errors.New("no QoS 2 PUBLISH")
			}
		}},
		{"QoS 2 out, no PUBCOMP", false, func(version byte, id string) (int, error) {
			c, err := qos2Out(version, id, true, nil)
			if c == nil {
				return 0, err
			}
			defer c.reset()
			if err != nil {
				return 1, err
			}
			_, err = c.expect(packets.Pubrel, 0)
			return 1, err
		}},
		{"during fan-out", false, func(version byte, id string) (int, error) {
			var n atomic.Int32
			three := make(chan struct{})
			c, err := connected(version, id, func(*packets.Packet) bool {
				if n.Add(1) == 3 {
					close(three)
				}
				return true
			})
			if err != nil {
				return 0, err
			}
			if err := c.subscribe(byte(len(id)%2), "fan/"+id); err != nil {
				c.close()
				return 1, err
			}
			big := bytes.Repeat([]byte{'f'}, 32<<10)
			stop := make(chan struct{})
			var pushed sync.WaitGroup
			pushed.Go(func() {
				for i := 0; i < 200; i++ {
					select {
					case <-stop:
						if i > 50 {
							return
						}
					default:
					}
					_ = pusher.Publish(context.Background(), "fan/"+id, big, byte(i%2), false)
				}
			})
			select {
			case <-three:
			case <-time.After(stressWait):
				err = errors.New("no fan-out arrived")
			}
			if len(id)%3 == 0 {
				c.reset()
			} else {
				c.close()
			}
			close(stop)
			pushed.Wait()
			return 1, err
		}},
		{"DISCONNECT", false, func(version byte, id string) (int, error) {
			c, err := connected(version, id, nil)
			if err != nil {
				return 0, err
			}
			return 0, c.disconnect(0)
		}},
		{"DISCONNECT with will", true, func(version byte, id string) (int, error) {
			c, err := connected(version, id, nil)
			if err != nil {
				return 0, err
			}
			return 1, c.disconnect(0x04) // [MQTT-3.14.4-3]
		}},
		{"while taken over", false, func(version byte, id string) (int, error) {
			a, err := connected(version, id, nil)
			if err != nil {
				return 0, err
			}
			b, err := dialStorm(tb.Addr, version, nil)
			if err != nil {
				a.close()
				return 1, err
			}
			var both sync.WaitGroup
			both.Go(a.reset)
			_, err = b.connect(id, true, nil)
			both.Wait()
			if err != nil {
				b.close()
				return 1, err
			}
			return 1, b.disconnect(0)
		}},
	}

	want := make(map[string]int)
	bounded(t, func() error {
		var errs errList
		var wantMu sync.Mutex
		var wg sync.WaitGroup
		for ci, tc := range cases {
			for _, version := range []byte{4, 5} {
				if tc.v5 && version == 4 {
					continue
				}
				for r := range reps {
					id := fmt.Sprintf("abrupt-%d-v%d-%d", ci, version, r)
					wg.Go(func() {
						n, err := tc.run(version, id)
						if err != nil {
							errs.add(fmt.Errorf("%s, %s: %w", tc.name, id, err))
						}
						wantMu.Lock()
						want[id] = n
						wantMu.Unlock()
					})
				}
			}
		}
		wg.Wait()
		return errs.err()
	})
	pusher.Close()

	// The watcher is all that is left.
	expectHoldings(t, tb.Broker, holdings{sessions: 1, subs: 1, indexed: 1, connected: 1, live: 0})
	waitFor(t, func() bool {
		wmu.Lock()
		defer wmu.Unlock()
		for id, n := range want {
			if wills[id] < n {
				return false
			}
		}
		return true
	}, "every will due")
	// A will sent twice would come at about the same time as the first.
	time.Sleep(rawQuiet)
	wmu.Lock()
	for id, n := range wills {
		if n != want[id] {
			t.Errorf("%s: %d wills, want %d", id, n, want[id])
		}
	}
	wmu.Unlock()
	expectGoroutines(t, base)
}

// TestStressSubscribeUnsubscribe: subscribers subscribe and unsubscribe
// overlapping filters over and over while publishers send QoS 1 messages.
// Each subscriber gets every message published after its SUBACK and
// acknowledged before its UNSUBSCRIBE, none twice, and none published
// after its UNSUBACK.
func TestStressSubscribeUnsubscribe(t *testing.T) {
	nSubs, nPubs, perPub := 10, 4, 250
	if testing.Short() {
		nSubs, nPubs, perPub = 6, 3, 100
	}
	tb := startBroker(t, nil)
	base := runtime.NumGoroutine()
	filters := []string{"ov/#", "ov/+/+", "ov/0/+", "ov/+/1", "ov/2/2", "ov/1/#", "+/+/0", "ov/+/#", "#"}
	topicOf := func(k int) string { return fmt.Sprintf("ov/%d/%d", k%3, k/3%3) }

	// sent is one message as its publisher saw it.
	type sent struct {
		topic, payload string
		at, acked      time.Time
	}
	// period is one subscription of a subscriber's, as it saw it.
	type period struct {
		filters                              []string
		subSent, subAck, unsubSent, unsubAck time.Time
	}
	type subscriber struct {
		mu      sync.Mutex
		got     map[string]int
		periods []period
		c       *stormClient
	}
	published := make([][]sent, nPubs)
	subs := make([]*subscriber, nSubs)

	bounded(t, func() error {
		var errs errList
		var pubs, subsWG sync.WaitGroup
		pubsDone := make(chan struct{})
		for i := range nSubs {
			s := &subscriber{got: make(map[string]int)}
			subs[i] = s
			c, err := dialStorm(tb.Addr, byte(4+i%2), func(pk *packets.Packet) bool {
				s.mu.Lock()
				s.got[string(pk.Payload)]++
				s.mu.Unlock()
				return true
			})
			if err != nil {
				return err
			}
			s.c = c
			if _, err := c.connect(fmt.Sprintf("sub-%d", i), true, nil); err != nil {
				return err
			}
			subsWG.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
				for {
					select {
					case <-pubsDone:
						return
					default:
					}
					p := period{}
					for _, k := range rng.Perm(len(filters))[:1+rng.IntN(3)] {
						p.filters = append(p.filters, filters[k])
					}
					p.subSent = time.Now()
					if err := c.subscribe(1, p.filters...); err != nil {
						errs.add(err)
						return
					}
					p.subAck = time.Now()
					time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
					p.unsubSent = time.Now()
					if err := c.unsubscribe(p.filters...); err != nil {
						errs.add(err)
						return
					}
					p.unsubAck = time.Now()
					s.mu.Lock()
					s.periods = append(s.periods, p)
					s.mu.Unlock()
				}
			})
		}
		for i := range nPubs {
			c, err := dialStorm(tb.Addr, byte(4+i%2), nil)
			if err != nil {
				return err
			}
			defer c.close()
			if _, err := c.connect(fmt.Sprintf("pub-%d", i), true, nil); err != nil {
				return err
			}
			pubs.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(100+i), uint64(time.Now().UnixNano())))
				for seq := range perPub {
					m := sent{topic: topicOf(rng.IntN(9)), payload: fmt.Sprintf("%d/%d", i, seq)}
					m.at = time.Now()
					if err := c.publish(m.topic, []byte(m.payload), 1); err != nil {
						errs.add(err)
						return
					}
					m.acked = time.Now()
					published[i] = append(published[i], m)
				}
			})
		}
		pubs.Wait()
		close(pubsDone)
		subsWG.Wait()
		if err := errs.err(); err != nil {
			return err
		}
		// Everything routed is in flight, pending or queued; once no
		// session has anything in flight or pending, a PINGRESP comes
		// after the last of it.
		deadline := time.Now().Add(stressWait)
		for !tb.drained() {
			if time.Now().After(deadline) {
				return errors.New("sessions still hold messages")
			}
			time.Sleep(5 * time.Millisecond)
		}
		for _, s := range subs {
			if err := s.c.ping(); err != nil {
				return err
			}
		}
		return nil
	})

	var all []sent
	for _, p := range published {
		all = append(all, p...)
	}
	failures := 0
	fail := func(format string, args ...any) {
		if failures++; failures <= 10 {
			t.Errorf(format, args...)
		}
	}
	for i, s := range subs {
		s.mu.Lock()
		seen := 0
		for _, m := range all {
			var must, may bool
			for _, p := range s.periods {
				if !slices.ContainsFunc(p.filters, func(f string) bool { return matcher.Matches(f, m.topic) }) {
					continue
				}
				must = must || (m.at.After(p.subAck) && m.acked.Before(p.unsubSent))
				may = may || (m.at.Before(p.unsubAck) && m.acked.After(p.subSent))
			}
			n := s.got[m.payload]
			seen += n
			switch {
			case n > 1:
				fail("subscriber %d got %s on %s %d times", i, m.payload, m.topic, n)
			case must && n == 0:
				fail("subscriber %d lost %s on %s, published while subscribed", i, m.payload, m.topic)
			case !may && n > 0:
				fail("subscriber %d got %s on %s, published while not subscribed", i, m.payload, m.topic)
			}
		}
		if total := sumValues(s.got); total != seen {
			fail("subscriber %d got %d messages, %d of them published", i, total, seen)
		}
		s.mu.Unlock()
		s.c.close()
	}
	expectHoldings(t, tb.Broker, holdings{})
	expectGoroutines(t, base)
}

func sumValues(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// drained reports whether no session has a QoS 1/2 message in flight or
// pending.
func (tb *testBroker) drained() bool {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	for _, s := range tb.sessions {
		s.mu.Lock()
		busy := len(s.inflight) > 0 || len(s.pending) > 0
		s.mu.Unlock()
		if busy {
			return false
		}
	}
	return true
}

// TestStressShutdownUnderLoad: Shutdown while 100 clients publish and
// subscribe, others connect and some sockets have not sent CONNECT yet.
// It returns within its context, MQTT 5 clients are told why, and every
// goroutine the broker started ends.
func TestStressShutdownUnderLoad(t *testing.T) {
	nClients := 100
	if testing.Short() {
		nClients = 40
	}
	base := runtime.NumGoroutine()
	passwd := writePasswordFile(t, "alice", "s3cret")
	tb := startBroker(t, func(o *Options) { o.PasswordFile = passwd })
	var received atomic.Int64
	var errs errList
	var ready, wg sync.WaitGroup
	ready.Add(nClients)
	// v5subs are the MQTT 5 subscribers, to be told 0x8B.
	var v5mu sync.Mutex
	var v5subs []*stormClient
	for i := range nClients {
		wg.Go(func() {
			done := sync.OnceFunc(ready.Done)
			defer done()
			version := byte(4 + i/2%2)
			c, err := dialStorm(tb.Addr, version, func(*packets.Packet) bool { received.Add(1); return true })
			if err != nil {
				errs.add(err)
				return
			}
			defer c.close()
			if _, err := c.connect(fmt.Sprintf("load-%d", i), true, nil); err != nil {
				errs.add(err)
				return
			}
			if i%2 == 0 {
				if err := c.subscribe(byte(i/4%2), "load/#"); err != nil {
					errs.add(err)
					return
				}
				if version == 5 {
					v5mu.Lock()
					v5subs = append(v5subs, c)
					v5mu.Unlock()
				}
				done()
				errs.add(c.waitClosed())
				return
			}
			done()
			// Publish until the broker goes.
			for seq := 0; c.publish(fmt.Sprintf("load/%d", i), []byte("payload"), byte(seq%3)) == nil; seq++ {
			}
			errs.add(c.waitClosed())
		})
	}
	// Sockets that never send CONNECT.
	var idle []net.Conn
	for range 5 {
		idle = append(idle, mustDial(t, "tcp", tb.Addr))
	}

	ready.Wait()
	waitFor(t, func() bool { return received.Load() >= 500 }, "messages flowing")
	// Clients still connecting when the broker stops, in halves to be
	// caught between them.
	stopConnecting := make(chan struct{})
	var connecting [4]atomic.Pointer[stormClient]
	for k := range connecting {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stopConnecting:
					return
				default:
				}
				nc, err := net.DialTimeout("tcp", tb.Addr, stressWait)
				if err != nil {
					return
				}
				c := newStormClient(nc, byte(4+k%2))
				c.start()
				pk := &packets.Packet{
					FixedHeader: packets.FixedHeader{Type: packets.Connect},
					Connect:     packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: fmt.Sprintf("late-%d-%d", k, i), Clean: true},
				}
				pk.ProtocolVersion = c.version
				var buf bytes.Buffer
				_ = pk.ConnectEncode(&buf)
				b := buf.Bytes()
				_ = c.sendBytes(b[:len(b)/2])
				_ = c.sendBytes(b[len(b)/2:])
				connecting[k].Store(c)
				_, err = c.expect(packets.Connack, 0)
				connecting[k].Store(nil)
				c.close()
				if err != nil {
					return
				}
			}
		})
	}
	// Clients whose CONNECT is being checked, a bcrypt hash at a time,
	// when the broker stops. Few: each check runs to its end, and they
	// take turns.
	var checked []string // their local addresses
	for i := range 2 {
		c, err := dialStorm(tb.Addr, byte(4+i%2), nil)
		if err != nil {
			t.Fatal(err)
		}
		checked = append(checked, c.nc.LocalAddr().String())
		wg.Go(func() {
			defer c.close()
			_, _ = c.connect(fmt.Sprintf("checked-%d", i), true, func(pk *packets.Packet) {
				pk.Connect.UsernameFlag, pk.Connect.Username = true, []byte("alice")
				pk.Connect.PasswordFlag, pk.Connect.Password = true, []byte("wrong")
			})
		})
	}
	// Once served, their CONNECTs are read at once and checked for long.
	// (Served first: a connection accepted as the listener closes may be
	// left open and unanswered, since mochi's listeners.Net drops it
	// without closing it.)
	waitFor(t, func() bool {
		tb.lmu.Lock()
		defer tb.lmu.Unlock()
		n := 0
		for c := range tb.live {
			if slices.Contains(checked, c.remote) {
				n++
			}
		}
		return n == len(checked)
	}, "the checked clients served")
	time.Sleep(20 * time.Millisecond)
	// Shutdown waits for the two checks, which take turns on one bcrypt
	// slot: a fraction of a second each on an idle machine, several
	// seconds each under -race on a loaded one.
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Scale(20*time.Second))
	defer cancel()
	began := time.Now()
	if err := tb.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown after %v: %v", time.Since(began), err)
	}
	close(stopConnecting)
	// Do not wait for a connection the listener dropped (see above).
	for k := range connecting {
		if c := connecting[k].Load(); c != nil {
			c.close()
		}
	}
	bounded(t, func() error {
		wg.Wait()
		return errs.err()
	})
	for _, nc := range idle {
		_ = nc.SetReadDeadline(time.Now().Add(stressWait))
		if _, err := nc.Read(make([]byte, 1)); err == nil || errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
			t.Errorf("socket without CONNECT still open after Shutdown: %v", err)
		}
		nc.Close()
	}
	for _, c := range v5subs {
		if got := c.goneWith.Load(); got != rcShuttingDown+1 {
			t.Errorf("MQTT 5 subscriber: DISCONNECT reason %d-1, want 0x8B", got)
		}
	}
	expectHoldings(t, tb.Broker, holdings{})
	expectGoroutines(t, base)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestStressShutdownStalledClient: a subscriber that stops reading holds
// the broker's writer in a blocked write. Shutdown returns when its
// context expires, and the connection's goroutines end then too, not a
// write timeout later.
func TestStressShutdownStalledClient(t *testing.T) {
	base := runtime.NumGoroutine()
	tb := startBroker(t, nil)
	nc := stalledClient(t, tb.Addr, "stalled", "flood", 0)
	_ = nc.(*net.TCPConn).SetReadBuffer(4 << 10)
	pub := localConnect(t, tb.Broker, "flooder")
	big := bytes.Repeat([]byte{'s'}, 64<<10)
	tb.mu.Lock()
	sc := tb.sessions["stalled"].conn
	tb.mu.Unlock()
	// Publish until the writer has bytes queued and sends none: it is
	// blocked in a write, with the socket buffers on both sides full.
	deadline := time.Now().Add(stressWait)
	for {
		for range 16 {
			if err := pub.Publish(context.Background(), "flood", big, 0, false); err != nil {
				t.Fatal(err)
			}
		}
		sent := tb.stats.bytesSent.Load()
		time.Sleep(50 * time.Millisecond)
		sc.qmu.Lock()
		blocked := sc.writing && sc.queuedB > 0
		sc.qmu.Unlock()
		if blocked && tb.stats.bytesSent.Load() == sent {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the writer still sends after %v", stressWait)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	began := time.Now()
	err := tb.Shutdown(ctx)
	if el := time.Since(began); el > 2*time.Second {
		t.Fatalf("Shutdown took %v with a 500ms context", el)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v, want the context's deadline", err)
	}
	pub.Close()
	expectHoldings(t, tb.Broker, holdings{})
	expectGoroutines(t, base)
}

// TestStressLocalClientsClose: in-process clients close while messages
// are in flight to them, from in-process and network publishers at every
// QoS, while other goroutines subscribe, unsubscribe and publish through
// them, some handlers publish, some clients close twice at once and some
// are taken over by a new in-process client of the same id. No call
// panics or hangs, and nothing is left of the clients.
func TestStressLocalClientsClose(t *testing.T) {
	rounds := 40
	if testing.Short() {
		rounds = 15
	}
	tb := startBroker(t, nil)
	base := runtime.NumGoroutine()
	ctx := context.Background()
	payload := bytes.Repeat([]byte{'l'}, 512)

	bounded(t, func() error {
		var errs errList
		stop := make(chan struct{})
		var pubs sync.WaitGroup
		for p := range 2 {
			pub, err := tb.Connect(fmt.Sprintf("lpub-%d", p))
			if err != nil {
				return err
			}
			pubs.Go(func() {
				defer pub.Close()
				for seq := 0; ; seq++ {
					select {
					case <-stop:
						return
					default:
					}
					errs.add(pub.Publish(ctx, fmt.Sprintf("loc/%d/%d", p, seq%8), payload, byte(seq%3), false))
				}
			})
		}
		npub, err := dialStorm(tb.Addr, 5, nil)
		if err != nil {
			return err
		}
		if _, err := npub.connect("npub", true, nil); err != nil {
			return err
		}
		pubs.Go(func() {
			defer npub.close()
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					errs.add(npub.disconnect(0))
					return
				default:
				}
				errs.add(npub.publish(fmt.Sprintf("loc/n/%d", seq%8), payload, byte(seq%2)))
			}
		})

		// use subscribes, unsubscribes and publishes through cl until a
		// call fails, which it may only once closing is set.
		use := func(cl *Client, closing *atomic.Bool, h Handler) {
			for k := 0; ; k++ {
				f := fmt.Sprintf("loc/%d/+", k%2)
				if err := cl.Subscribe(f, byte(k%3), h); err != nil {
					if !closing.Load() || !errors.Is(err, ErrClientClosed) {
						errs.add(fmt.Errorf("subscribe: %w", err))
					}
					return
				}
				cl.Unsubscribe(f)
				if err := cl.Publish(ctx, f[:len(f)-1]+"x", payload, byte(k%3), false); err != nil {
					if !closing.Load() || !errors.Is(err, ErrClientClosed) {
						errs.add(fmt.Errorf("publish: %w", err))
					}
					return
				}
			}
		}
		var rw sync.WaitGroup
		for r := range rounds {
			rw.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(r), uint64(time.Now().UnixNano())))
				id := fmt.Sprintf("lsub-%d", r)
				cl, err := tb.Connect(id)
				if err != nil {
					errs.add(err)
					return
				}
				closing := new(atomic.Bool)
				var n atomic.Int64
				h := func(Message) {
					n.Add(1)
					if r%3 == 0 {
						time.Sleep(20 * time.Microsecond)
					}
					if r%5 == 0 {
						if err := cl.Publish(ctx, "echo/"+id, payload, 1, false); err != nil && !errors.Is(err, ErrClientClosed) {
							errs.add(err)
						}
					}
				}
				if err := cl.Subscribe("loc/#", byte(r%3), h); err != nil {
					errs.add(err)
				}
				// Another goroutine keeps using the client as it closes.
				var users sync.WaitGroup
				users.Go(func() { use(cl, closing, h) })
				// Let messages flow, then close with some in flight.
				for deadline := time.Now().Add(stressWait); n.Load() < 5 && time.Now().Before(deadline); {
					time.Sleep(100 * time.Microsecond)
				}
				time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
				switch r % 4 {
				case 0:
					closing.Store(true)
					var twice sync.WaitGroup
					twice.Go(cl.Close)
					twice.Go(cl.Close)
					twice.Wait()
				case 1:
					// A chain of takeovers by new clients of the same
					// id, each in use as the next takes it over.
					cur, curClosing := cl, closing
					for range 10 {
						curClosing.Store(true)
						next, err := tb.Connect(id)
						if err != nil {
							errs.add(err)
							break
						}
						cur.Close()
						nextClosing := new(atomic.Bool)
						users.Go(func() { use(next, nextClosing, func(Message) {}) })
						cur, curClosing = next, nextClosing
						time.Sleep(time.Duration(rng.IntN(500)) * time.Microsecond)
					}
					curClosing.Store(true)
					cur.Close()
				default:
					closing.Store(true)
					cl.Close()
				}
				users.Wait()
			})
		}
		rw.Wait()
		close(stop)
		pubs.Wait()
		return errs.err()
	})
	expectHoldings(t, tb.Broker, holdings{})
	expectGoroutines(t, base)
}
