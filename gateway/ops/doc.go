// Package ops serves the gateway's operations endpoint over HTTP:
//
//   - /healthz answers 200 "ok" while the process serves;
//   - /readyz answers 200, or 503 with the reason Sources.Ready gives;
//   - /metrics is the Prometheus text exposition format, version 0.0.4;
//   - / is a status page for a phone or a laptop: identity and uptime,
//     sensors with their last values and a sparkline of the last hour,
//     relays with a switch, bridges, connected clients;
//   - POST /outputs/{name} switches a relay (state=on or state=off).
//
// The package sees the gateway only through Sources, a struct of functions
// the gateway fills, and its own view types, so it imports neither the
// broker, the bridge nor the sensors.
//
// Everything is bounded: server timeouts, header size, open connections
// (in all and per source address, see gate.go; past them only the probes
// are answered), form size, concurrent password checks, and the history. The history
// samples Sources.Sensors every 30 s into a fixed ring of 120 slots (one
// hour) per quantity: 480 bytes of float32 samples each, plus its key, with
// one shared ring of sample times (960 bytes) and at most 256 quantities.
//
// Switching needs credentials: the ops token, or an MQTT user's login when
// the broker has a password file (Sources.CheckPassword is told the
// request's address, so that the broker limits its failures as it does an
// MQTT client's), for an output whose set topic the broker's ACL lets that
// user publish to (Sources.MaySwitch). With neither configured it works
// without credentials only on a loopback listener and is refused with 403
// elsewhere. Cross-site form posts are refused whatever the credentials.
// Off loopback the status page, which names clients, users and addresses,
// needs the same login; the probes and /metrics do not.
//
// # Why a hand-written exposition writer
//
// The metrics page is written by about a hundred lines of ours rather than
// a library, for its cost on a Pi. Stripped linux/arm64 builds of
// cmd/fieldgate (CGO_ENABLED=0, -trimpath -ldflags "-s -w", Go 1.26),
// with this package linked in and the same metric families in each:
//
//	without this package                     8,650,914 bytes
//	hand-written writer (this package)      10,682,530 bytes
//	github.com/VictoriaMetrics/metrics 1.45 10,813,602 bytes (+128 KiB)
//	github.com/prometheus/client_golang 1.25 12,910,754 bytes (+2.1 MiB)
//
// client_golang brings protobuf, procfs and its registry; VictoriaMetrics is
// small but leaves escaping label values to the caller, so we would keep
// the hard part of the writer anyway. The format is simple and stable, and
// the tests parse our output with the Prometheus parser. Of the 2.0 MiB
// this package adds, about 1.7 MiB is html/template: text/template looks
// methods up by name at run time, so the linker keeps every exported
// method of every type in the binary; the rest is under 0.3 MiB.
package ops
