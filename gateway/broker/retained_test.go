package broker

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
)

// TestRetainedSubscribeRace: one client publishes retained messages in a
// tight loop while another subscribes and unsubscribes over and over. Each
// subscription gets the retained message current when it was made, or one
// newer, then only newer ones live: no message twice (once retained, once
// live), none older than what was routed before the SUBSCRIBE, and never a
// retained copy after a live one.
func TestRetainedSubscribeRace(t *testing.T) {
	t.Parallel()
	rounds := 300
	if testing.Short() {
		rounds = 100
	}
	for _, tc := range []struct {
		name   string
		stored bool
		qos    byte // the publisher's
	}{
		{"memory", false, 0},
		{"stored lazily", true, 0},
		{"stored durably", true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var tb *testBroker
			if tc.stored {
				tb = newStoredBroker(t, nil).tb
			} else {
				tb = startBroker(t, nil)
			}
			retainedRace(t, tb, tc.qos, rounds)
		})
	}
}

// retainedRace runs the race of TestRetainedSubscribeRace on tb for the
// given number of subscriptions.
func retainedRace(t *testing.T, tb *testBroker, qos byte, rounds int) {
	addr := tb.Addr
	rs := &tb.retained
	const topic = "race/t"
	// got holds what each subscription received, by its subscription
	// identifier: a late live message of one subscription may come
	// after the next one's SUBACK.
	type received struct {
		n      int
		retain bool
	}
	var mu sync.Mutex
	got := make(map[int][]received)
	sub, err := dialStorm(addr, 5, func(pk *packets.Packet) bool {
		n, err := strconv.Atoi(string(pk.Payload))
		ids := pk.Properties.SubscriptionIdentifier
		mu.Lock()
		defer mu.Unlock()
		if err != nil || len(ids) != 1 {
			got[0] = append(got[0], received{-1, false})
			return true
		}
		got[ids[0]] = append(got[ids[0]], received{n, pk.FixedHeader.Retain})
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.close()
	if _, err := sub.connect("race-sub", true, nil); err != nil {
		t.Fatal(err)
	}
	pub, err := dialStorm(addr, 5, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.close()
	if _, err := pub.connect("race-pub", true, nil); err != nil {
		t.Fatal(err)
	}

	// routed is the last message the broker is known to have routed:
	// acknowledged at QoS 1, or followed by a PINGRESP at QoS 0.
	var routed atomic.Int64
	stop := make(chan struct{})
	pubErr := make(chan error, 1)
	go func() {
		pubErr <- func() error {
			for n := 1; ; n++ {
				select {
				case <-stop:
					return nil
				default:
				}
				pk := rawPublish(topic, strconv.Itoa(n), qos, true, 0)
				if qos > 0 {
					pk.PacketID = pub.nextPID()
				}
				if err := pub.send(pk); err != nil {
					return err
				}
				switch {
				case qos > 0:
					if _, err := pub.expect(packets.Puback, pk.PacketID); err != nil {
						return err
					}
				case n%8 == 0:
					if err := pub.ping(); err != nil {
						return err
					}
				default:
					continue
				}
				routed.Store(int64(n))
			}
		}()
	}()

	floor := make([]int, rounds+1) // by round: routed before its SUBSCRIBE
	for k := 1; k <= rounds; k++ {
		if k%25 == 0 {
			// What housekeeping does each second, here more often,
			// so that it runs amid the scans.
			rs.tidy()
		}
		floor[k] = int(routed.Load())
		pk := rawSubscribe(sub.nextPID(), packets.Subscription{Filter: topic})
		pk.Properties.SubscriptionIdentifier = []int{k}
		if err := sub.send(pk); err != nil {
			t.Fatal(err)
		}
		if _, err := sub.expect(packets.Suback, pk.PacketID); err != nil {
			t.Fatal(err)
		}
		if err := sub.unsubscribe(topic); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	if err := <-pubErr; err != nil {
		t.Fatal(err)
	}
	// The publisher's last PINGRESP or PUBACK came: everything it sent
	// has been routed, and is before this PINGRESP.
	if err := pub.ping(); err != nil {
		t.Fatal(err)
	}
	if err := sub.ping(); err != nil {
		t.Fatal(err)
	}
	if n := rs.scans.Load(); n != 0 {
		t.Errorf("%d retained scans still counted after every SUBSCRIBE was answered", n)
	}
	if rs.db != nil {
		// Once storage has applied every change and no scan is under
		// way, the store holds no change of its own.
		rs.tidy()
		applied := make(chan error, 1)
		rs.db.After(func(err error) { applied <- err })
		if err := <-applied; err != nil {
			t.Fatal(err)
		}
		rs.tidy()
		rs.mu.RLock()
		left := len(rs.recent)
		rs.mu.RUnlock()
		if left != 0 {
			t.Errorf("%d recent retained changes held after storage applied them", left)
		}
	}

	mu.Lock()
	defer mu.Unlock()
	if bad := got[0]; len(bad) > 0 {
		t.Fatalf("%d messages without a payload number or one subscription identifier", len(bad))
	}
	failures := 0
	for k := 1; k <= rounds && failures < 5; k++ {
		msgs := got[k]
		var why string
		switch {
		case len(msgs) == 0 && floor[k] > 0:
			why = "nothing, though a retained message was there"
		case len(msgs) > 0 && msgs[0].n < floor[k]:
			why = fmt.Sprintf("first %d, older than %d, routed before the SUBSCRIBE", msgs[0].n, floor[k])
		}
		for i := 1; i < len(msgs) && why == ""; i++ {
			switch {
			case msgs[i].n <= msgs[i-1].n:
				why = fmt.Sprintf("%d after %d", msgs[i].n, msgs[i-1].n)
			case msgs[i].retain:
				why = fmt.Sprintf("a retained copy of %d after a live message", msgs[i].n)
			}
		}
		if why != "" {
			failures++
			t.Errorf("subscription %d got %v (payload, retain): %s", k, msgs, why)
		}
	}
}
