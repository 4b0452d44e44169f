package broker

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/mochi-mqtt/server/v2/packets"
)

// BenchmarkFootprint measures what the broker holds in memory for an idle
// network connection and for a subscription: the live heap and the
// goroutine stacks after two full collections, before and after the
// clients arrive. The clients are real MQTT 3.1.1 clients over loopback
// TCP, with clean sessions and no keepalive, in a child process (this test
// binary again, as TestFootprintClients), so that nothing of theirs is
// counted and each process holds one socket per connection, which keeps a
// 10,000-connection run under an open-file limit of 20,000.
//
// A measurement is a state, not a rate: each sub-benchmark measures once
// on a fresh broker, however many iterations the testing package asks for
// (-benchtime=1x asks for one). Connections are measured once per process:
// goroutines that ended leave their descriptors for the next ones to reuse,
// so a second measurement would count less than a gateway that never had
// those connections holds. For several runs, start the binary again rather
// than pass -count. GOARCH=386 gives the figures of a 32-bit board.
func BenchmarkFootprint(b *testing.B) {
	conns := *footprintConns
	b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
		if footprintConnsMeasured {
			b.Skip("connections were measured in this process already, and would now reuse the descriptors of ended goroutines; run the binary again instead of -count")
		}
		footprintConnsMeasured = true
		checkFileLimit(b, conns)
		var d footprintDelta
		measureOnce(b, func() {
			fp := startFootprint(b, 1)
			base := fp.measure()
			fp.command(b, fmt.Sprintf("connect %s %d", fp.addr, conns))
			fp.await(b, int64(conns), 0)
			d = fp.measure().minus(base)
			fp.stop(b)
		})
		b.ReportMetric(0, "ns/op")
		b.ReportMetric(float64(d.heap)/float64(conns), "heap-B/conn")
		b.ReportMetric(float64(d.stack)/float64(conns), "stack-B/conn")
		b.ReportMetric(float64(d.goroutines)/float64(conns), "goroutines/conn")
	})
	subConns := max(*footprintSubConns, 1)
	perConn := (*footprintSubs + subConns - 1) / subConns
	subs := perConn * subConns
	b.Run(fmt.Sprintf("subs=%d/conns=%d", subs, subConns), func(b *testing.B) {
		checkFileLimit(b, subConns)
		var d footprintDelta
		measureOnce(b, func() {
			fp := startFootprint(b, perConn)
			fp.command(b, fmt.Sprintf("connect %s %d", fp.addr, subConns))
			fp.await(b, int64(subConns), 0)
			connected := fp.measure()
			fp.command(b, fmt.Sprintf("subscribe %d", perConn))
			fp.await(b, int64(subConns), subs)
			d = fp.measure().minus(connected)
			fp.stop(b)
		})
		b.ReportMetric(0, "ns/op")
		b.ReportMetric(float64(d.heap)/float64(subs), "heap-B/sub")
	})
}

// footprintConnsMeasured records that this process has measured
// connections (see BenchmarkFootprint).
var footprintConnsMeasured bool

// measureOnce runs measure on the first iteration b asks for; the others
// are empty.
func measureOnce(b *testing.B, measure func()) {
	first := true
	for b.Loop() {
		if first {
			measure()
			first = false
		}
	}
}

// Sizes of BenchmarkFootprint, which the benchmark scripts lower for a
// smoke run.
var (
	footprintConns    = flag.Int("footprint.conns", 10000, "BenchmarkFootprint: idle connections")
	footprintSubs     = flag.Int("footprint.subs", 100000, "BenchmarkFootprint: subscriptions, spread evenly over -footprint.subconns connections")
	footprintSubConns = flag.Int("footprint.subconns", 100, "BenchmarkFootprint: connections holding the subscriptions")
)

// footprintEnv marks the child process that holds the clients.
const footprintEnv = "FIELDGATE_FOOTPRINT_CLIENTS"

// footprintRunnerEnv, when set, is the command, with its options, that
// starts the child process: the emulator, when the benchmark runs under
// qemu-user and the kernel cannot start the binary by itself.
const footprintRunnerEnv = "FIELDGATE_FOOTPRINT_RUNNER"

// footprintWait bounds every wait of a measurement: setting up 10,000
// connections takes a few seconds on a loaded two-core machine.
var footprintWait = testkit.Scale(2 * time.Minute)

// checkFileLimit skips a benchmark whose sockets would not fit under the
// open-file limit, which Go has already raised to the hard limit.
func checkFileLimit(b *testing.B, conns int) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Fatalf("open-file limit: %v", err)
	}
	if need := uint64(conns) + 64; uint64(lim.Cur) < need {
		b.Skipf("%d connections need %d open files in each process; the limit is %d", conns, need, lim.Cur)
	}
}

// footprint is one measurement: a fresh broker and the child process whose
// clients connect to it.
type footprint struct {
	tb    *testBroker
	addr  string
	child *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Scanner
}

// startFootprint starts a broker with the released defaults, but without
// $SYS publishing (a fixed cost, and it would wake the broker while
// measuring) and with the per-client subscription limit raised to maxSubs;
// then it starts the child process and warms both up with one connection
// and one subscription that come and go, so that what the broker sets up
// once is in the baseline.
func startFootprint(b *testing.B, maxSubs int) *footprint {
	b.Helper()
	tb := startBroker(b, func(o *Options) { o.MaxSubscriptions = max(o.MaxSubscriptions, maxSubs) })
	fp := &footprint{tb: tb, addr: tb.Addr}
	args := append(strings.Fields(os.Getenv(footprintRunnerEnv)), os.Args[0], "-test.run=^TestFootprintClients$")
	fp.child = exec.Command(args[0], args[1:]...)
	fp.child.Env = append(os.Environ(), footprintEnv+"=1")
	fp.child.Stderr = os.Stderr
	var err error
	if fp.in, err = fp.child.StdinPipe(); err != nil {
		b.Fatal(err)
	}
	out, err := fp.child.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	fp.out = bufio.NewScanner(out)
	if err := fp.child.Start(); err != nil {
		b.Fatalf("starting the client process: %v", err)
	}
	b.Cleanup(func() {
		if fp.child.ProcessState == nil {
			_ = fp.child.Process.Kill()
			_ = fp.child.Wait()
		}
	})
	fp.command(b, "connect "+fp.addr+" 1")
	fp.command(b, "subscribe 1")
	fp.command(b, "close")
	fp.await(b, 0, 0)
	return fp
}

// command sends the child one command and waits for its "ok".
func (fp *footprint) command(b *testing.B, cmd string) {
	b.Helper()
	if _, err := fmt.Fprintln(fp.in, cmd); err != nil {
		b.Fatalf("client process: %s: %v", cmd, err)
	}
	for fp.out.Scan() {
		line := fp.out.Text()
		if line == "ok" {
			return
		}
		if msg, ok := strings.CutPrefix(line, "error: "); ok {
			b.Fatalf("client process: %s: %s", cmd, msg)
		}
	}
	b.Fatalf("client process: %s: it exited without an answer (%v)", cmd, fp.out.Err())
}

// await waits until the broker counts conns connected clients and subs
// subscriptions: a SUBACK goes after the index has the filters, but a
// closed connection is counted out on the broker's own time.
func (fp *footprint) await(b *testing.B, conns int64, subs int) {
	b.Helper()
	deadline := time.Now().Add(footprintWait)
	for {
		st := fp.tb.Stats()
		if st.Connected == conns && st.Subscriptions == subs {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("broker has %d clients and %d subscriptions, want %d and %d", st.Connected, st.Subscriptions, conns, subs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stop closes the clients and the child process, and waits until the
// broker has let go of their connections.
func (fp *footprint) stop(b *testing.B) {
	b.Helper()
	fp.command(b, "close")
	fp.in.Close()
	for fp.out.Scan() { // the test binary's closing lines
	}
	if err := fp.child.Wait(); err != nil {
		b.Fatalf("client process: %v", err)
	}
	fp.await(b, 0, 0)
}

// footprintDelta is memory and goroutines, or their growth.
type footprintDelta struct {
	heap, stack, goroutines int64
}

// measure reads the live heap after two full collections (the first can
// leave objects that only finalizers freed), the stacks in use and the
// goroutines. A short pause first lets goroutines that have just answered
// a client park again.
func (fp *footprint) measure() footprintDelta {
	time.Sleep(200 * time.Millisecond)
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return footprintDelta{heap: int64(ms.HeapAlloc), stack: int64(ms.StackInuse), goroutines: int64(runtime.NumGoroutine())}
}

func (d footprintDelta) minus(o footprintDelta) footprintDelta {
	return footprintDelta{heap: d.heap - o.heap, stack: d.stack - o.stack, goroutines: d.goroutines - o.goroutines}
}

// footprintFilter is subscription k of connection c, distinct from every
// other: 10% with a single-level wildcard, 5% with a multi-level one, the
// shapes of the side-by-side broker benchmark's subscription scenario.
func footprintFilter(c, k int) string {
	switch {
	case k%20 == 19:
		return "fleet/" + strconv.Itoa(c) + "/dev" + strconv.Itoa(k) + "/#"
	case k%10 == 4:
		return "fleet/" + strconv.Itoa(c) + "/+/dev" + strconv.Itoa(k) + "/temp"
	}
	return "fleet/" + strconv.Itoa(c) + "/site/dev" + strconv.Itoa(k) + "/temp"
}

// TestFootprintClients is BenchmarkFootprint's client process; it skips
// unless the benchmark started it. It reads commands, one a line, and
// answers each with "ok" or "error: ..." on standard output:
//
//	connect ADDR N   open N more connections to ADDR
//	subscribe K      subscribe every open connection to K filters of its own
//	close            close every connection
//
// At the end of its input it closes what is left and returns.
func TestFootprintClients(t *testing.T) {
	if os.Getenv(footprintEnv) == "" {
		t.Skip("the client process of BenchmarkFootprint")
	}
	var conns []net.Conn
	defer func() { closeFootprintClients(conns) }()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var err error
		switch f := strings.Fields(in.Text()); {
		case len(f) == 3 && f[0] == "connect":
			var n int
			if n, err = strconv.Atoi(f[2]); err == nil {
				var more []net.Conn
				more, err = dialFootprintClients(f[1], len(conns), n)
				conns = append(conns, more...)
			}
		case len(f) == 2 && f[0] == "subscribe":
			var k int
			if k, err = strconv.Atoi(f[1]); err == nil {
				err = subscribeFootprintClients(conns, k)
			}
		case len(f) == 1 && f[0] == "close":
			closeFootprintClients(conns)
			conns = nil
		default:
			err = fmt.Errorf("unknown command %q", in.Text())
		}
		if err != nil {
			fmt.Printf("error: %v\n", err)
			return
		}
		fmt.Println("ok")
	}
}

// footprintDialers is how many connections are set up at once: enough to
// keep both cores busy, few enough for the listen backlog.
const footprintDialers = 8

// dialFootprintClients opens n connections to addr, numbered from first,
// each with CONNECT (clean session, no keepalive) answered.
func dialFootprintClients(addr string, first, n int) ([]net.Conn, error) {
	conns := make([]net.Conn, n)
	err := footprintEach(n, func(i int) error {
		nc, err := net.DialTimeout("tcp", addr, footprintWait)
		if err != nil {
			return err
		}
		conns[i] = nc
		pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 4}
		pk.Connect = packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: "fp" + strconv.Itoa(first+i), Clean: true}
		connect, err := mqttwire.Encode(&pk)
		if err != nil {
			return err
		}
		body, err := footprintExchange(nc, connect, packets.Connack)
		if err != nil {
			return err
		}
		if len(body) != 2 || body[1] != 0 {
			return fmt.Errorf("CONNACK % x", body)
		}
		return nil
	})
	if err != nil {
		closeFootprintClients(conns)
		return nil, err
	}
	return conns, nil
}

// subscribeFootprintClients subscribes each connection to k filters of its
// own in one SUBSCRIBE, and checks that every one was granted.
func subscribeFootprintClients(conns []net.Conn, k int) error {
	return footprintEach(len(conns), func(c int) error {
		filters := make(packets.Subscriptions, k)
		for i := range filters {
			filters[i] = packets.Subscription{Filter: footprintFilter(c, i), Qos: 1}
		}
		pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, ProtocolVersion: 4, PacketID: 1, Filters: filters}
		subscribe, err := mqttwire.Encode(&pk)
		if err != nil {
			return err
		}
		body, err := footprintExchange(conns[c], subscribe, packets.Suback)
		if err != nil {
			return err
		}
		if len(body) != 2+k {
			return fmt.Errorf("SUBACK for %d filters has %d bytes", k, len(body))
		}
		for i, code := range body[2:] {
			if code > 2 {
				return fmt.Errorf("filter %q refused with 0x%02x", filters[i].Filter, code)
			}
		}
		return nil
	})
}

// footprintEach runs fn for 0..n-1 on footprintDialers goroutines and
// returns the first failure.
func footprintEach(n int, fn func(i int) error) error {
	var (
		next  atomic.Int64
		first error
		once  sync.Once
		wg    sync.WaitGroup
	)
	for range min(footprintDialers, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { first = fmt.Errorf("connection %d: %w", i, err) })
					next.Store(int64(n)) // the others stop at their next one
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// footprintExchange writes a packet to nc and reads the reply, which must
// be of type want, returning its body.
func footprintExchange(nc net.Conn, packet []byte, want byte) ([]byte, error) {
	_ = nc.SetDeadline(time.Now().Add(footprintWait))
	defer nc.SetDeadline(time.Time{})
	if _, err := nc.Write(packet); err != nil {
		return nil, err
	}
	fh, body, err := mqttwire.ReadPacket(bufio.NewReader(nc), 0, nil)
	if err != nil {
		return nil, err
	}
	if fh.Type != want {
		return nil, fmt.Errorf("packet type %d instead of %d", fh.Type, want)
	}
	return body, nil
}

// closeFootprintClients closes conns with a reset, so that no TIME_WAIT
// is left to use up the ephemeral ports of repeated runs.
func closeFootprintClients(conns []net.Conn) {
	for _, nc := range conns {
		if nc == nil {
			continue
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		nc.Close()
	}
}
