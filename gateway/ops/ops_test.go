package ops

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
)

func TestHealthz(t *testing.T) {
	f := newFakeGateway()
	f.ready, f.why = false, "storage not open"
	_, base := startServer(t, "", f.sources())
	// Health is about the process serving, not about readiness.
	resp, body := get(t, base+"/healthz")
	if resp.StatusCode != http.StatusOK || body != "ok\n" {
		t.Fatalf("/healthz = %d %q, want 200 \"ok\\n\"", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("/healthz Content-Type = %q, want text/plain", ct)
	}
}

func TestReadyz(t *testing.T) {
	f := newFakeGateway()
	_, base := startServer(t, "", f.sources())

	resp, body := get(t, base+"/readyz")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz while ready = %d %q, want 200", resp.StatusCode, body)
	}

	f.mu.Lock()
	f.ready, f.why = false, "bridge cloud: not connected after its 30s grace period"
	f.mu.Unlock()
	resp, body = get(t, base+"/readyz")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/readyz while not ready = %d, want 503", resp.StatusCode)
	}
	if !strings.Contains(body, "bridge cloud: not connected after its 30s grace period") {
		t.Errorf("/readyz body %q does not carry the reason", body)
	}
}

func TestNilSources(t *testing.T) {
	// A gateway that fills nothing still gets every page, all empty.
	_, base := startServer(t, "", Sources{})
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/metrics": 200, "/": 200} {
		if resp, body := get(t, base+path); resp.StatusCode != want {
			t.Errorf("GET %s = %d, want %d: %s", path, resp.StatusCode, want, body)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/outputs/pump", strings.NewReader("state=on"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if resp, body := do(t, req); resp.StatusCode != http.StatusNotImplemented {
		t.Errorf("POST /outputs/pump without SetOutput = %d %q, want 501", resp.StatusCode, body)
	}
}

func TestRoutes(t *testing.T) {
	_, base := startServer(t, "", newFakeGateway().sources())
	tests := []struct {
		method, path string
		want         int
	}{
		{"GET", "/nothing-here", http.StatusNotFound},
		{"GET", "/healthz/extra", http.StatusNotFound},
		{"POST", "/healthz", http.StatusMethodNotAllowed},
		{"DELETE", "/metrics", http.StatusMethodNotAllowed},
		{"GET", "/outputs/pump", http.StatusMethodNotAllowed},
		{"HEAD", "/healthz", http.StatusOK},
	}
	for _, tt := range tests {
		req, _ := http.NewRequest(tt.method, base+tt.path, nil)
		if resp, _ := do(t, req); resp.StatusCode != tt.want {
			t.Errorf("%s %s = %d, want %d", tt.method, tt.path, resp.StatusCode, tt.want)
		}
	}
}

func TestStartPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s := New(ln.Addr().String(), Sources{}, nil)
	err = s.Start()
	if err == nil {
		s.Shutdown(context.Background())
		t.Fatal("Start on a port in use succeeded")
	}
	for _, want := range []string{"ops.address", ln.Addr().String(), "already in use"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Start error %q does not mention %q", err, want)
		}
	}
	if s.Addr() != nil {
		t.Errorf("Addr after a failed Start = %v, want nil", s.Addr())
	}
}

func TestStartTwice(t *testing.T) {
	s, _ := startServer(t, "", Sources{})
	if err := s.Start(); err != ErrStarted {
		t.Fatalf("second Start = %v, want ErrStarted", err)
	}
}

func TestShutdownStopsServing(t *testing.T) {
	s := New("127.0.0.1:0", Sources{}, testLogger(t))
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown before Start = %v, want nil", err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	addr := s.Addr().String()
	if resp, _ := get(t, "http://"+addr+"/healthz"); resp.StatusCode != 200 {
		t.Fatalf("/healthz = %d", resp.StatusCode)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if c, err := net.DialTimeout("tcp", addr, testkit.Scale(time.Second)); err == nil {
		c.Close()
		t.Fatal("the port still accepts connections after Shutdown")
	}
}

func TestHeaderLimits(t *testing.T) {
	_, base := startServer(t, "", Sources{})
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The server answers once it has read past the limit; read the status
	// line before it closes the connection on the rest.
	go c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Padding: " + strings.Repeat("a", 2*maxHeaderBytes) + "\r\n\r\n"))
	c.SetReadDeadline(time.Now().Add(testkit.Scale(5 * time.Second)))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("no answer to a request with %d bytes of headers: %v", 2*maxHeaderBytes, err)
	}
	if !strings.Contains(line, " 431 ") {
		t.Errorf("a request with %d bytes of headers got %q, want 431", 2*maxHeaderBytes, line)
	}
}

func TestSlowHeadersAreCut(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the header timeout")
	}
	_, base := startServer(t, "", Sources{})
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Start a request and never finish its headers.
	if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(readHeaderTimeout + testkit.Scale(5*time.Second)))
	_, err = bufio.NewReader(c).ReadByte()
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the server held a connection with unfinished headers for %s", time.Since(start))
	}
	if took := time.Since(start); took > readHeaderTimeout+2*time.Second {
		t.Errorf("the server cut unfinished headers after %s, want about %s", took, readHeaderTimeout)
	}
}

// holdConn opens a connection from the local address from (such as
// 127.0.0.2) and, with a request, has it served once and kept alive: a
// keep-alive connection the server holds idle.
func holdConn(t *testing.T, addr, from string, request bool) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: testkit.Scale(5 * time.Second)}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if request {
		if code := roundTrip(t, c, "/healthz"); code != 200 {
			t.Fatalf("/healthz on a free slot = %d", code)
		}
	}
	return c
}

// roundTrip sends GET path on c and returns the status code, 0 when the
// connection closed or said nothing within a few seconds.
func roundTrip(t *testing.T, c net.Conn, path string) int {
	t.Helper()
	if _, err := c.Write([]byte("GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		return 0
	}
	c.SetReadDeadline(time.Now().Add(testkit.Scale(5 * time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestConnectionLimits fills one source's share of the slots with idle
// keep-alive connections, then every slot: a probe is answered at once
// all the same, the status page of another source is served while it has
// slots, and what is past a limit gets 503 and is counted.
func TestConnectionLimits(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Address, cfg.MaxConns, cfg.MaxConnsPerSource = "127.0.0.1:0", 6, 4
	s := NewFromConfig(cfg, newFakeGateway().sources(), testLogger(t))
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	addr := s.Addr().String()

	for range cfg.MaxConnsPerSource {
		holdConn(t, addr, "127.0.0.1", true)
	}
	// Past its share, the source gets probes answered and nothing else.
	if code := roundTrip(t, holdConn(t, addr, "127.0.0.1", false), "/healthz"); code != 200 {
		t.Errorf("/healthz past the per-source limit = %d, want 200", code)
	}
	if code := roundTrip(t, holdConn(t, addr, "127.0.0.1", false), "/readyz"); code != 200 {
		t.Errorf("/readyz past the per-source limit = %d, want 200", code)
	}
	if code := roundTrip(t, holdConn(t, addr, "127.0.0.1", false), "/"); code != 503 {
		t.Errorf("the status page past the per-source limit = %d, want 503", code)
	}
	// Another source still has slots.
	other := holdConn(t, addr, "127.0.0.2", false)
	if code := roundTrip(t, other, "/"); code != 200 {
		t.Errorf("the status page from another source = %d, want 200", code)
	}
	holdConn(t, addr, "127.0.0.3", true) // the last slot
	if code := roundTrip(t, holdConn(t, addr, "127.0.0.4", false), "/"); code != 503 {
		t.Errorf("the status page with every slot taken = %d, want 503", code)
	}
	if code := roundTrip(t, holdConn(t, addr, "127.0.0.4", false), "/healthz"); code != 200 {
		t.Errorf("/healthz with every slot taken = %d, want 200", code)
	}
	if got := s.gated.perSource.Load(); got != 3 {
		t.Errorf("%d connections counted past the per-source limit, want 3", got)
	}
	if got := s.gated.total.Load(); got != 2 {
		t.Errorf("%d connections counted past the total limit, want 2", got)
	}
	// A slot freed serves the status page again.
	other.Close()
	testkit.WaitFor(t, 5*time.Second, "a freed slot serving the status page", func() bool {
		return roundTrip(t, holdConn(t, addr, "127.0.0.4", false), "/") == 200
	})
}

// TestIdleTimeout checks that an idle keep-alive connection gives its
// slot back after ops.idle_timeout.
func TestIdleTimeout(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Address, cfg.IdleTimeout, cfg.MaxConns, cfg.MaxConnsPerSource = "127.0.0.1:0", time.Second, 1, 1
	s := NewFromConfig(cfg, Sources{}, testLogger(t))
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	addr := s.Addr().String()
	idle := holdConn(t, addr, "127.0.0.1", true)
	start := time.Now()
	idle.SetReadDeadline(time.Now().Add(testkit.Scale(10 * time.Second)))
	if _, err := idle.Read(make([]byte, 1)); err == nil {
		t.Fatal("the idle connection got data")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the idle connection was still open after %s", time.Since(start))
	}
	took := time.Since(start)
	if took < cfg.IdleTimeout/2 || took > cfg.IdleTimeout+testkit.Scale(3*time.Second) {
		t.Errorf("an idle connection was closed after %s, want about %s", took, cfg.IdleTimeout)
	}
	testkit.WaitFor(t, 5*time.Second, "the slot freed", func() bool {
		return roundTrip(t, holdConn(t, addr, "127.0.0.1", false), "/metrics") == 200
	})
}

// TestDependencies checks the package's place in the layering: it must
// not import the packages it reports on, and the test-only libraries
// (the Prometheus parser, the browser driver) must stay out of it.
func TestDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{
			"github.com/fieldgate/fieldgate/gateway/broker",
			"github.com/fieldgate/fieldgate/gateway/bridge",
			"github.com/fieldgate/fieldgate/sensors",
			"github.com/prometheus/",
			"github.com/chromedp/",
			"github.com/VictoriaMetrics/",
		} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("ops depends on %s", dep)
			}
		}
	}
}
