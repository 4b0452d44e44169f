package matcher

import (
	"fmt"
	"sync"
	"testing"
)

// TestConcurrentMatchAndUpdate runs matches against subscribe, unsubscribe
// and SetOnline from other goroutines; under -race it checks the locking,
// and the stable subscriptions must be delivered on every match.
func TestConcurrentMatchAndUpdate(t *testing.T) {
	x := NewIndex()
	const stable = Handle(1)
	for _, f := range []string{"plant/+/temp", "plant/line1/temp", "$share/g/plant/#"} {
		if _, err := x.Subscribe(stable, f, 1, 0); err != nil {
			t.Fatal(err)
		}
	}
	var writers, readers sync.WaitGroup
	stop := make(chan struct{})
	for w := range 2 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				h := Handle(100 + w*1000 + i%500)
				f := fmt.Sprintf("plant/line%d/+", i%50)
				if _, err := x.Subscribe(h, f, 2, uint32(i%7)); err != nil {
					t.Error(err)
					return
				}
				x.SetOnline(h, i%2 == 0)
				x.Unsubscribe(h, f)
			}
		}()
	}
	failures := make(chan string, 4)
	for range 4 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			var r Result
			for i := range 20_000 {
				x.Match(fmt.Sprintf("plant/line%d/temp", i%3), NoHandle, &r)
				direct, shared := 0, 0
				for _, d := range r.Deliveries {
					if d.Handle == stable && !d.Shared {
						direct++
					}
					if d.Shared {
						shared++
					}
				}
				if direct != 1 || shared != 1 {
					failures <- fmt.Sprintf("match %d: %d direct and %d shared deliveries for the stable session, want 1 and 1", i, direct, shared)
					return
				}
			}
		}()
	}
	readers.Wait()
	close(stop)
	writers.Wait()
	close(failures)
	for f := range failures {
		t.Error(f)
	}
}
