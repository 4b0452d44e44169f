package matcher

import (
	"errors"
	"testing"
)

// FuzzSubscribeOptions subscribes sessions to one filter with arbitrary
// options bytes and identifiers, as a broker restoring subscriptions from
// a state file does, matches a topic and unsubscribes them all. Options
// granting QoS 3 must be refused with ErrQoS: the index marks member
// lists with that value, and a subscription holding it once made Match
// and Unsubscribe index a list that did not exist. Every other options
// byte must come back from Match as given (its low six bits; No Local
// aside, which the publisher here never trips), and the index must end
// empty.
//
//	go test -run '^$' -fuzz FuzzSubscribeOptions -fuzztime 15s ./matcher
func FuzzSubscribeOptions(f *testing.F) {
	f.Add([]byte{1, 0x01}, false)
	f.Add([]byte{1, 0x03}, false) // QoS 3: once a panic on Unsubscribe and Match
	f.Add([]byte{1, 0x02, 2, 0x03}, true)
	f.Add([]byte{1, 0x3e, 2, 0x2d, 3, 0x00}, false)
	f.Add([]byte{5, 0xff, 5, 0x01}, true)
	f.Fuzz(func(t *testing.T, subs []byte, shared bool) {
		filter := "a/+/#"
		if shared {
			filter = "$share/g/a/+/#"
		}
		x := NewIndex()
		want := map[Handle]Options{}
		for i := 0; i+1 < len(subs) && i < 32; i += 2 {
			h, opts := Handle(1+subs[i]%8), Options(subs[i+1])
			_, err := x.Subscribe(h, filter, opts, uint32(i))
			switch {
			case opts.QoS() == 3:
				if !errors.Is(err, ErrQoS) {
					t.Fatalf("options 0x%02x: %v, want ErrQoS", opts, err)
				}
			case shared && opts&NoLocal != 0:
				if !errors.Is(err, ErrShareNoLocal) {
					t.Fatalf("No Local on a shared subscription: %v", err)
				}
			case err != nil:
				t.Fatalf("options 0x%02x: %v", opts, err)
			default:
				want[h] = opts & 0x3f
			}
		}
		var r Result
		x.Match("a/b/c", NoHandle, &r)
		got := 0
		for _, d := range r.Deliveries {
			o, ok := want[d.Handle]
			if !ok {
				t.Fatalf("delivery to %d, which holds no subscription", d.Handle)
			}
			if d.Opts != o {
				t.Fatalf("handle %d: options 0x%02x, subscribed with 0x%02x", d.Handle, d.Opts, o)
			}
			got++
		}
		if shared && len(want) > 0 && got != 1 || !shared && got != len(want) {
			t.Fatalf("%d deliveries for %d subscribers (shared %v)", got, len(want), shared)
		}
		for h := range want {
			if !x.Unsubscribe(h, filter) {
				t.Fatalf("handle %d: nothing to unsubscribe", h)
			}
		}
		if x.Len() != 0 {
			t.Fatalf("%d subscriptions left", x.Len())
		}
	})
}
