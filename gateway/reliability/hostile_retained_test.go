package reliability

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/relrecord"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/mochi-mqtt/server/v2/packets"
)

// The retained scan case: a state file full of retained messages, and
// subscribers to # that read slowly.
const (
	scanPayload = 8 << 10 // bytes of each retained message
	// scanPauseEvery and scanPause make the subscribers slow: a pause
	// after every so many messages, so that the gateway must hold the
	// rest back rather than push them into the socket.
	scanPauseEvery = 100
	scanPause      = 20 * time.Millisecond
	// scanAnonGrowth bounds the gateway's anonymous memory (its heap and
	// stacks, what a memory cap cannot reclaim) during the scans, over
	// what it held before them: the two subscribers' byte budgets
	// (broker.max_queued_bytes, 1 MiB each by default) and windows, with
	// room for the collector's slack. The file's pages the scans read are
	// mapped, not anonymous, and count in VmRSS only.
	scanAnonGrowth = 48 << 20
)

// scanRetained is how many retained messages the case stores: for make
// soak 20,000 (160 MB, a third of a 512 MB board), as a big site leaves
// them; for make test 2,000 (16 MB), still sixteen times the 1 MiB a
// subscriber's budget holds, where the broker before the streamed scan
// dropped all but about 127 of them.
var scanRetained = relrecord.Pick(2000, 20000)

// retainedScanConfig is a gateway with the broker's default budgets. Its
// retained store is the one bound raised: the case is a site whose
// operator sized broker.max_retained_* for its many retained messages
// (the defaults, 10,000 messages and 16 MiB, 2,500 and 4 MiB per user,
// would refuse most of them), so that what is measured is the scan of a
// store that large, not the bound. Anonymous clients share one user, so
// the per-user bounds are raised as far.
func retainedScanConfig() string {
	// Each message counts its payload, its topic and its properties; the
	// 100 more are the gateway's own.
	n, bytes := scanRetained+100, (scanRetained+100)*(scanPayload+128)
	return plainYAML(fmt.Sprintf("  max_retained_messages: %d\n  max_retained_bytes: %d\n  max_retained_messages_per_user: %d\n  max_retained_bytes_per_user: %d\n", n, bytes, n, bytes))
}

// TestHostileRetainedScan: scanRetained retained messages of 8 KB are in the
// state file; a QoS 1 and a QoS 0 subscriber to # read them slowly. Each
// gets every one of them, none dropped, while a control client's QoS 1
// publishes keep being acknowledged within a bound, and the gateway's
// anonymous memory grows by no more than the subscribers' budgets.
func TestHostileRetainedScan(t *testing.T) {
	rec := relrecord.Begin(t, "hostile", "retained # scan")
	ackBound := testkit.Scale(2 * time.Second)
	rec.Add("attack", "%d retained messages of %d B (%d MB), then two subscribers to # (QoS 1 and QoS 0) reading %d messages then pausing %s",
		scanRetained, scanPayload, scanRetained*scanPayload>>20, scanPauseEvery, scanPause)

	bin := buildGateway(t, t.TempDir())
	g := newGatewayYAML(t, bin, retainedScanConfig())
	g.start()

	began := time.Now()
	if err := fillScanRetained(g.addr); err != nil {
		rec.Fail("filling the retained store: %v", err)
		t.Fatalf("filling the retained store: %v", err)
	}
	testkit.WaitFor(t, testkit.Scale(time.Minute), "every retained message stored", func() bool {
		return g.metric("fieldgate_broker_retained_messages") >= float64(scanRetained)
	})
	rec.Add("fill", "%d retained messages stored in %s", scanRetained, time.Since(began).Round(time.Millisecond))
	// A fresh process, so that the figures are the scans' and not the
	// filling's: the messages are in the file, as a long-running site
	// (or an attacker's earlier visit) leaves them.
	g.stop()
	g.start()

	pid := g.pid()
	before, err := procStatus(pid)
	if err != nil {
		t.Fatal(err)
	}
	peak := before
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-tick.C:
			}
			if m, err := procStatus(pid); err == nil {
				peak.rss, peak.anon = max(peak.rss, m.rss), max(peak.anon, m.anon)
			}
		}
	}()

	// The control client publishes at QoS 1 throughout and times each
	// acknowledgement.
	ctl, _, err := dial(g.addr, "control", true, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.close()
	var (
		ctlMu    sync.Mutex
		ctlWorst time.Duration
		ctlN     int
		ctlLate  int
	)
	ctlStop := make(chan struct{})
	ctlErr := make(chan error, 1)
	go func() {
		ctlErr <- func() error {
			for n := 1; ; n++ {
				select {
				case <-ctlStop:
					return nil
				case <-time.After(100 * time.Millisecond):
				}
				pid := uint16(n%60000 + 1)
				sent := time.Now()
				if err := ctl.publish("control/ping", strconv.Itoa(n), 1, pid, false); err != nil {
					return err
				}
				pk, err := ctl.read(ackBound)
				if err != nil {
					return fmt.Errorf("control publish %d not acknowledged within %s: %w", n, ackBound, err)
				}
				if pk.FixedHeader.Type != packets.Puback || pk.PacketID != pid {
					return fmt.Errorf("control publish %d: %s %d instead of its PUBACK", n, packetName(pk), pk.PacketID)
				}
				d := time.Since(sent)
				ctlMu.Lock()
				ctlWorst = max(ctlWorst, d)
				ctlN++
				if d > ackBound/2 {
					ctlLate++
				}
				ctlMu.Unlock()
			}
		}()
	}()

	type result struct {
		got  int
		took time.Duration
		err  error
	}
	results := make([]result, 2)
	var wg sync.WaitGroup
	for i, qos := range []byte{1, 0} {
		wg.Go(func() {
			got, took, err := scanSubscriber(g.addr, fmt.Sprintf("scan-qos%d", qos), qos)
			results[i] = result{got, took, err}
		})
	}
	wg.Wait()
	close(ctlStop)
	close(stopSampling)
	<-sampled
	if err := <-ctlErr; err != nil {
		rec.Fail("%v", err)
		t.Error(err)
	}
	dropped := g.metric(`fieldgate_broker_messages_dropped_total{reason="queue"}`)

	for i, qos := range []byte{1, 0} {
		r := results[i]
		rec.Add(fmt.Sprintf("qos%d subscriber", qos), "%d of %d retained messages in %s", r.got, scanRetained, r.took.Round(time.Millisecond))
		if r.err != nil || r.got != scanRetained {
			rec.Fail("QoS %d subscriber: %d of %d retained messages: %v", qos, r.got, scanRetained, r.err)
			t.Errorf("QoS %d subscriber to #: %d of %d retained messages: %v", qos, r.got, scanRetained, r.err)
		}
	}
	rec.Add("dropped", "%.0f messages counted dropped", dropped)
	if dropped != 0 {
		rec.Fail("%.0f messages dropped", dropped)
		t.Errorf("%.0f messages counted dropped; the scans must wait for room, not drop", dropped)
	}
	ctlMu.Lock()
	rec.Add("control acks", "%d QoS 1 publishes acknowledged during the scans, the slowest in %s, %d over %s (bound %s)",
		ctlN, ctlWorst.Round(time.Millisecond), ctlLate, ackBound/2, ackBound)
	ctlMu.Unlock()
	rec.Add("gateway memory", "VmRSS %d MB before the scans, peak %d MB (the state file's mapped pages count here); anonymous %d MB before, peak %d MB (bound +%d MB)",
		before.rss>>20, peak.rss>>20, before.anon>>20, peak.anon>>20, scanAnonGrowth>>20)
	if grew := peak.anon - before.anon; grew > scanAnonGrowth {
		rec.Fail("anonymous memory grew %d MB during the scans", grew>>20)
		t.Errorf("the gateway's anonymous memory grew %d MB during the scans, over the bound of %d MB: the scans hold messages in memory", grew>>20, scanAnonGrowth>>20)
	}
	rec.Add("gateway rss", "%d MB after the scans (g.rss)", g.rss()>>20)
}

// scanFillWindow is how many of the filler's QoS 1 publishes may await
// their PUBACK at once: enough for the broker's group commit to gather
// them into few transactions.
const scanFillWindow = 32

// fillScanRetained stores the case's retained messages through the
// broker at QoS 1, scanFillWindow unacknowledged at a time. Each PUBACK
// comes once its message is in the state file; one refused (a reason
// code of 0x80 or above, as past a broker.max_retained_* bound) fails the
// fill at once, naming the topic and the code.
func fillScanRetained(addr string) error {
	fill, _, err := dial(addr, "filler", true, 0, 0)
	if err != nil {
		return err
	}
	defer fill.close()
	payload := []byte(strings.Repeat("x", scanPayload))
	acked := 0
	await := func() error {
		pk, err := fill.read(ioTimeout)
		if err != nil {
			return fmt.Errorf("waiting for a PUBACK after %d acknowledged: %w", acked, err)
		}
		if pk.FixedHeader.Type != packets.Puback {
			return fmt.Errorf("%s instead of a PUBACK after %d acknowledged", packetName(pk), acked)
		}
		if pk.ReasonCode >= 0x80 {
			return fmt.Errorf("retained publish of %s refused with reason 0x%02X after %d stored: are the gateway's broker.max_retained_* bounds raised for %d messages?",
				scanTopic(int(pk.PacketID)-1), pk.ReasonCode, acked, scanRetained)
		}
		acked++
		return nil
	}
	for i := range scanRetained {
		if i-acked >= scanFillWindow {
			if err := await(); err != nil {
				return err
			}
		}
		if err := fill.write(&packets.Packet{
			FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Retain: true},
			TopicName:   scanTopic(i), Payload: payload, PacketID: uint16(i + 1),
		}); err != nil {
			return err
		}
	}
	for acked < scanRetained {
		if err := await(); err != nil {
			return err
		}
	}
	fill.disconnect()
	return nil
}

// scanTopic is the topic of retained message i.
func scanTopic(i int) string { return fmt.Sprintf("site/dev-%03d/point-%03d", i/100, i%100) }

// scanSubscriber subscribes to # at qos as id, reads slowly and returns
// how many distinct retained messages of the case it received, each in
// full, and how long that took. It fails on a duplicate, a wrong payload,
// or a wait past ioTimeout.
func scanSubscriber(addr, id string, qos byte) (int, time.Duration, error) {
	c, _, err := dial(addr, id, true, 0, 32)
	if err != nil {
		return 0, 0, err
	}
	defer c.close()
	began := time.Now()
	if err := c.subscribe("#", qos); err != nil {
		return 0, 0, err
	}
	seen := make(map[string]bool, scanRetained)
	lastAt := time.Now()
	for len(seen) < scanRetained {
		// The control client's live messages keep coming: a scan that
		// has stopped shows as a long wait for a retained one.
		if time.Since(lastAt) > ioTimeout {
			return len(seen), time.Since(began), fmt.Errorf("no retained message for %s after %d", ioTimeout, len(seen))
		}
		pk, err := c.read(ioTimeout)
		if err != nil {
			return len(seen), time.Since(began), fmt.Errorf("after %d messages: %w", len(seen), err)
		}
		if pk.FixedHeader.Type != packets.Publish {
			continue
		}
		if pk.FixedHeader.Qos > 0 {
			if err := c.ack(packets.Puback, pk.PacketID); err != nil {
				return len(seen), time.Since(began), err
			}
		}
		if !strings.HasPrefix(pk.TopicName, "site/") {
			continue // the control client's, live
		}
		switch {
		case !pk.FixedHeader.Retain:
			return len(seen), time.Since(began), fmt.Errorf("%s without the retain flag", pk.TopicName)
		case len(pk.Payload) != scanPayload:
			return len(seen), time.Since(began), fmt.Errorf("%s with %d bytes, want %d", pk.TopicName, len(pk.Payload), scanPayload)
		case seen[pk.TopicName]:
			return len(seen), time.Since(began), fmt.Errorf("%s twice", pk.TopicName)
		}
		seen[pk.TopicName] = true
		lastAt = time.Now()
		if len(seen)%scanPauseEvery == 0 {
			time.Sleep(scanPause)
		}
	}
	return len(seen), time.Since(began), nil
}

// procMem is what /proc/PID/status says of a process's memory, in bytes.
type procMem struct{ rss, anon int64 }

// procStatus reads VmRSS and RssAnon from /proc/PID/status; unlike
// gateway.rss it may run off the test's goroutine.
func procStatus(pid int) (procMem, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procMem{}, err
	}
	var m procMem
	found := 0
	for _, line := range strings.Split(string(b), "\n") {
		for _, f := range []struct {
			key string
			to  *int64
		}{{"VmRSS:", &m.rss}, {"RssAnon:", &m.anon}} {
			if rest, ok := strings.CutPrefix(line, f.key); ok {
				kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				if err != nil {
					return procMem{}, fmt.Errorf("%s line %q: %w", f.key, line, err)
				}
				*f.to = kb << 10
				found++
			}
		}
	}
	if found != 2 {
		return procMem{}, errors.New("no VmRSS or RssAnon in /proc/PID/status")
	}
	return m, nil
}
