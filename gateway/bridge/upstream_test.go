package bridge

// The bridge's tests reach the upstream through internal/testkit: a real
// Mosquitto per test (mosquitto), a proxy that can go silent (faultproxy)
// and Paho watchers (pahotest).

import (
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
)

// upWaitBase bounds every wait on the upstream in tests: far above what
// any step takes on an idle machine. upWait is it on the suite's time
// scale, so that a loaded machine does not fail a correct run.
const upWaitBase = 20 * time.Second

var upWait = testkit.Scale(upWaitBase)

// waitFor polls cond until it holds, failing the test after upWait.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testkit.WaitFor(t, upWaitBase, what, cond)
}
