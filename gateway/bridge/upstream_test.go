package bridge

// The bridge's tests reach the upstream test kit (a real Mosquitto per
// test, a proxy that can go silent, Paho watchers) in upstreamtest, which
// the upstream client's tests share, under these short names.

import (
	"testing"

	"github.com/fieldgate/fieldgate/gateway/bridge/upstreamtest"
)

// upWait bounds every wait on the upstream in tests.
const upWait = upstreamtest.Wait

// waitFor polls cond until it holds, failing the test after upWait.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	upstreamtest.WaitFor(t, what, cond)
}

// MosquittoConfig selects what a test's Mosquitto runs with.
type MosquittoConfig = upstreamtest.MosquittoConfig

// startMosquitto runs Mosquitto for the test until it ends.
func startMosquitto(t testing.TB, cfg MosquittoConfig) *upstreamtest.Mosquitto {
	t.Helper()
	return upstreamtest.StartMosquitto(t, cfg)
}

// newProxy forwards to target until the test ends.
func newProxy(t testing.TB, target string) *upstreamtest.Proxy {
	t.Helper()
	return upstreamtest.NewProxy(t, target)
}

// watchV5 subscribes a Paho MQTT 5 client to filter on addr.
func watchV5(t testing.TB, addr, id, filter string, qos byte) *upstreamtest.V5Watcher {
	t.Helper()
	return upstreamtest.WatchV5(t, addr, id, filter, qos)
}
