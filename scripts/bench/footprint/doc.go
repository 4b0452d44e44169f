// Package footprint is the logic behind cmd/footprint and
// bench-footprint.sh, which measure what fieldgate costs a small board:
// the size of the release binaries, the memory of an idle connection and
// of a subscription (BenchmarkFootprint in gateway/broker, for 386 and
// amd64), and the resident memory of the ARM binaries running the default
// configuration under QEMU user-mode emulation.
//
// Idle measures a gateway at rest for bench-idle.sh: once it is ready
// (and its bridge up) and has settled, the CPU time the kernel counts for
// it over a stretch in which nothing else touches it.
//
// Watch follows one running gateway: it waits until the ops endpoint says
// ready, subscribes to the readings, and once a second samples the
// process's resident set from /proc and the gateway's own figures from
// /metrics, writing one raw line per sample and one result line at the
// end.
//
// The raw output of a run is line-oriented text: "key: value" header
// lines (describe_machine in lib.sh), "size" and "deb" lines, Go benchmark
// lines of BenchmarkFootprint after a "heap-binary:" line, and "sample",
// "rss", "config" and "idle" lines of space-separated key=value pairs; "# warn" lines
// report problems. Package report reads it and writes the summary that
// docs/BENCHMARKS.md shows.
package footprint
