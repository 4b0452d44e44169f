package reliability

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
)

// Bounds on the gateway process, so that a test never hangs on it, on
// the suite's time scale.
var (
	// buildTimeout covers a cold build cache on a slow board.
	buildTimeout = testkit.Scale(5 * time.Minute)
	// readyTimeout is how long a start may take to accept a CONNECT: it
	// restores every queued message from the state file first, which grows
	// over a soak run.
	readyTimeout = testkit.Scale(60 * time.Second)
	// exitTimeout is how long a killed or stopped process may take to be
	// reaped.
	exitTimeout = testkit.Scale(15 * time.Second)
)

// tailLines is how much of the gateway's log a failure prints.
const tailLines = 60

// configureProc sets process attributes the platform offers; on Linux the
// gateway is killed with the test binary, should that die first.
var configureProc = func(*exec.Cmd) {}

// buildGateway builds cmd/fieldgate into dir and returns the binary's
// path. The binary is not race-instrumented: it is the program under test,
// not the test.
func buildGateway(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "fieldgate")
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/fieldgate/fieldgate/cmd/fieldgate")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build of the gateway: %v\n%s", err, out)
	}
	return bin
}

// gateway is one fieldgate process at a time on a fixed state file and
// port: started, killed, started again.
type gateway struct {
	t       *testing.T
	bin     string
	dir     string
	cfgPath string
	dbPath  string
	addr    string
	opsAddr string // the ops endpoint: /metrics, /healthz
	log     *tail

	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has been reaped
	starts int
}

// newGatewayWith writes a configuration with a state file in a fresh
// directory and a free loopback port, and extra top-level configuration
// (such as a bridges: section, or nothing) appended to it. The process is
// killed when the test ends, and the tail of its log printed if the test
// failed.
func newGatewayWith(t *testing.T, bin, extra string) *gateway {
	t.Helper()
	// The budgets are far above what a run queues, and a full queue
	// refuses rather than drops: the test counts on every acknowledged
	// message staying queued until its subscriber takes it.
	return newGatewayYAML(t, bin, fmt.Sprintf(`log:
  level: info
storage:
  path: %%STATE%%
  max_queued_bytes: %d
  queue_policy: refuse
broker:
  allow_anonymous: true
  max_queued_bytes: %d
  sys_interval: 0s
listeners:
  - name: mqtt
    type: tcp
    address: %%ADDR%%
ops:
  address: %%OPS%%
sensors: []
outputs: []
`, 1<<30, 1<<30)+extra)
}

// plainYAML is a gateway configuration with no sensors and no bridge,
// for newGatewayYAML: the state file, a broker that admits anonymous
// clients and publishes no $SYS, with brokerKeys (whole lines, indented
// by two spaces; may be empty) added to its section, one TCP listener
// named mqtt, and the ops endpoint.
func plainYAML(brokerKeys string) string {
	return `log:
  level: info
storage:
  path: %STATE%
broker:
  allow_anonymous: true
  sys_interval: 0s
` + brokerKeys + `listeners:
  - name: mqtt
    type: tcp
    address: %ADDR%
ops:
  address: %OPS%
sensors: []
outputs: []
`
}

// newGatewayYAML writes the whole configuration body, in which %STATE%,
// %ADDR% and %OPS% stand for the state file, the MQTT listener's address
// and the ops endpoint's, each quoted; a fresh directory and free
// loopback ports fill them in. The process is killed when the test ends,
// and the tail of its log printed if the test failed.
func newGatewayYAML(t *testing.T, bin, body string) *gateway {
	t.Helper()
	dir := t.TempDir()
	g := &gateway{
		t: t, bin: bin, dir: dir,
		cfgPath: filepath.Join(dir, "fieldgate.yaml"),
		dbPath:  filepath.Join(dir, "state.db"),
		addr:    testkit.FreeAddr(t),
		opsAddr: testkit.FreeAddr(t),
		log:     &tail{max: 256 << 10},
	}
	cfg := strings.NewReplacer(
		"%STATE%", strconv.Quote(g.dbPath),
		"%ADDR%", strconv.Quote(g.addr),
		"%OPS%", strconv.Quote(g.opsAddr),
	).Replace(body)
	if err := os.WriteFile(g.cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.kill()
		if t.Failed() {
			t.Logf("last %d lines of the gateway's log:\n%s", tailLines, g.log.lines(tailLines))
		}
	})
	return g
}

// start runs the gateway and returns once it has answered a CONNECT.
func (g *gateway) start() {
	g.t.Helper()
	if g.cmd != nil {
		g.t.Fatal("gateway started twice")
	}
	g.starts++
	fmt.Fprintf(g.log, "=== start %d\n", g.starts)
	cmd := exec.Command(g.bin, "run", "-config", g.cfgPath)
	cmd.Stdout, cmd.Stderr = g.log, g.log
	configureProc(cmd)
	if err := cmd.Start(); err != nil {
		g.t.Fatalf("starting the gateway: %v", err)
	}
	g.cmd, g.exited = cmd, make(chan struct{})
	exited := g.exited
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	deadline := time.Now().Add(readyTimeout)
	for {
		c, _, err := dial(g.addr, "reliability-probe", true, 0, 0)
		if err == nil {
			c.disconnect()
			g.awaitOps(deadline)
			return
		}
		select {
		case <-exited:
			g.t.Fatalf("the gateway exited at start %d: %v", g.starts, cmd.ProcessState)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("the gateway did not accept a CONNECT within %s of start %d: %v", readyTimeout, g.starts, err)
		}
	}
}

// kill sends SIGKILL, as a power cut or the OOM killer would end it, and
// waits for the process to be gone. It does nothing when none runs.
func (g *gateway) kill() {
	if g.cmd == nil {
		return
	}
	_ = g.cmd.Process.Kill()
	g.reap("killed")
}

// stop asks the gateway to shut down with SIGTERM and fails the test
// unless it exits cleanly.
func (g *gateway) stop() {
	g.t.Helper()
	if g.cmd == nil {
		return
	}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	state := g.reap("stopped")
	if state == nil || !state.Success() {
		g.t.Errorf("the gateway did not stop cleanly on SIGTERM: %v", state)
	}
}

func (g *gateway) reap(how string) *os.ProcessState {
	cmd := g.cmd
	g.cmd = nil
	select {
	case <-g.exited:
	case <-time.After(exitTimeout):
		_ = cmd.Process.Kill()
		g.t.Errorf("the gateway was not gone %s after being %s", exitTimeout, how)
		return nil
	}
	fmt.Fprintf(g.log, "=== %s: %v\n", how, cmd.ProcessState)
	return cmd.ProcessState
}

// checkState runs `fieldgate db check` on the state file of a stopped
// gateway: whatever the kills interrupted, the file must verify.
func (g *gateway) checkState() {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, g.bin, "db", "check", "-path", g.dbPath).CombinedOutput()
	if err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			g.t.Fatalf("fieldgate db check: %v", err)
		}
		g.t.Errorf("fieldgate db check on the state file after %d starts: %v\n%s", g.starts, err, out)
	}
}

// tail keeps the last max bytes written to it; the gateway's stdout and
// stderr across all its starts go here.
type tail struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (w *tail) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	if len(w.buf) > 2*w.max {
		w.buf = append(w.buf[:0], w.buf[len(w.buf)-w.max:]...)
	}
	return len(p), nil
}

// lines returns the last n lines.
func (w *tail) lines(n int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := bytes.TrimRight(w.buf, "\n")
	i := len(b)
	for ; n > 0 && i > 0; n-- {
		i = bytes.LastIndexByte(b[:i], '\n')
		if i < 0 {
			i = 0
		}
	}
	return strings.TrimLeft(string(b[i:]), "\n")
}

// pid is the running gateway's process id; the test fails when none runs.
func (g *gateway) pid() int {
	g.t.Helper()
	if g.cmd == nil {
		g.t.Fatal("the gateway is not running")
	}
	return g.cmd.Process.Pid
}

// rss returns the running gateway's resident set size in bytes, from
// /proc/PID/status.
func (g *gateway) rss() int64 {
	g.t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", g.pid()))
	if err != nil {
		g.t.Fatalf("reading the gateway's status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				g.t.Fatalf("VmRSS line %q: %v", line, err)
			}
			return kb << 10
		}
	}
	g.t.Fatal("no VmRSS in /proc/PID/status")
	return 0
}

// metric returns the value of an unlabelled sample (such as go_goroutines
// or process_resident_memory_bytes) from the gateway's /metrics.
func (g *gateway) metric(name string) float64 {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.opsAddr+"/metrics", nil)
	if err != nil {
		g.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		g.t.Fatalf("GET /metrics: %v %v", resp.Status, err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				g.t.Fatalf("/metrics line %q: %v", line, err)
			}
			return v
		}
	}
	g.t.Fatalf("/metrics has no sample %s", name)
	return 0
}

// awaitOps waits for the ops endpoint, which opens a moment after the MQTT
// listener, to answer /healthz, so that metric works right after start.
func (g *gateway) awaitOps(deadline time.Time) {
	g.t.Helper()
	for {
		resp, err := http.Get("http://" + g.opsAddr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("the ops endpoint did not answer /healthz by %s after start %d: %v", readyTimeout, g.starts, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// reload sends SIGHUP and waits until the gateway logs that it applied the
// configuration file again.
func (g *gateway) reload() {
	g.t.Helper()
	const done = "configuration reloaded"
	before := strings.Count(g.log.lines(1<<20), done)
	if err := g.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		g.t.Fatalf("SIGHUP: %v", err)
	}
	testkit.WaitFor(g.t, readyTimeout, "the gateway to log "+strconv.Quote(done), func() bool {
		return strings.Count(g.log.lines(1<<20), done) > before
	})
}

// passwd sets user's password in the password file path with the
// gateway's own `fieldgate passwd`, as an installer would.
func passwd(t *testing.T, bin, path, user, password string) {
	t.Helper()
	cmd := exec.Command(bin, "passwd", path, user)
	cmd.Stdin = strings.NewReader(password + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("fieldgate passwd %s %s: %v\n%s", path, user, err, out)
	}
}

// awaitLog waits until the gateway's log holds text: its output reaches
// the test through a pipe, after whatever it answered over the network.
func (g *gateway) awaitLog(text string) {
	g.t.Helper()
	testkit.WaitFor(g.t, readyTimeout, "the gateway to log "+strconv.Quote(text), func() bool {
		return strings.Contains(g.log.lines(1<<20), text)
	})
}
