package matcher_test

import (
	"fmt"
	"slices"

	"github.com/fieldgate/fieldgate/matcher"
)

// An Index holds every subscription of every session; Match finds the
// sessions a topic goes to, deduplicated, with the highest QoS each was
// granted. One Result per goroutine is reused, so matching allocates
// nothing once it has grown.
func ExampleIndex() {
	x := matcher.NewIndex()
	const dashboard, logger, pump matcher.Handle = 1, 2, 3

	x.Subscribe(dashboard, "site/+/temp", 1, 0)
	x.Subscribe(logger, "site/#", 0, 0)
	x.Subscribe(logger, "site/greenhouse/temp", 2, 0) // the same session again: one delivery, QoS 2
	x.Subscribe(pump, "site/greenhouse/pump/set", 1, 0)

	var r matcher.Result
	x.Match("site/greenhouse/temp", matcher.NoHandle, &r)
	slices.SortFunc(r.Deliveries, func(a, b matcher.Delivery) int { return int(a.Handle) - int(b.Handle) })
	for _, d := range r.Deliveries {
		fmt.Printf("session %d at QoS %d\n", d.Handle, d.Opts.QoS())
	}
	// Output:
	// session 1 at QoS 1
	// session 2 at QoS 2
}

// Filters are checked before they reach the index; the errors say what is
// wrong with them.
func ExampleValidateFilter() {
	for _, f := range []string{"site/+/temp", "site/#/temp", "$share/loggers/site/#"} {
		if err := matcher.ValidateFilter(f); err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println("ok:", f)
	}
	// Output:
	// ok: site/+/temp
	// filter "site/#/temp": '#' must be the last level (at byte 5)
	// ok: $share/loggers/site/#
}

// A shared subscription delivers each message to one member of its group.
func ExampleSplitShared() {
	group, inner, ok := matcher.SplitShared("$share/loggers/site/#")
	fmt.Println(group, inner, ok)
	// Output: loggers site/# true
}
