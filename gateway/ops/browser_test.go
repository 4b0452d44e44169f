package ops

import (
	"bytes"
	"context"
	"image/color"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/fieldgate/fieldgate/internal/testkit"
)

// browserInstall is what to run when the browser test finds no chromium.
const browserInstall = "apt-get install -y chromium (as root; or make system-packages)"

// chromium returns the path of the headless browser; without one the test
// fails, since the status page would go untested.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	t.Fatalf("chromium is not installed, and the status page needs it for this test; install it: %s", browserInstall)
	return ""
}

// TestStatusPageInBrowser loads the status page in headless chromium,
// reads the figures back from the DOM, checks the layout on a phone-sized
// and a laptop-sized viewport, switches a relay by clicking it, and takes
// a full-page screenshot.
func TestStatusPageInBrowser(t *testing.T) {
	exe := chromium(t)
	f := newFakeGateway()
	f.switched = make(chan setCall, 4)
	s, base := startServer(t, "127.0.0.1:0", f.sources())
	// An hour of a temperature that rises and falls, for the sparkline.
	for i := range historySlots {
		f.mu.Lock()
		f.sensors[0].Values[0].Value = 20 + float64(i%40)/10
		f.mu.Unlock()
		s.sample(epoch.Add(-time.Hour + time.Duration(i+1)*sampleEvery))
	}
	f.mu.Lock()
	f.sensors[0].Values[0].Value = 21.5
	f.mu.Unlock()

	browserOut := &testkit.Buffer{}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(exe),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(390, 844),
		chromedp.CombinedOutput(browserOut),
	)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(allocCtx)
	defer cancel()
	// The browser lives as long as the context of its first Run, so it
	// starts on ctx, bounded by a timer instead, and each step of the test
	// then has a time limit of its own on a context derived from ctx: a
	// slow start on a loaded machine takes nothing from the steps after it.
	limit := testkit.Scale(30 * time.Second)
	step := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, limit) }
	defer func() {
		if t.Failed() {
			t.Logf("browser output:\n%s", browserOut.String())
		}
	}()

	var mu sync.Mutex
	var requests, problems []string
	if err := chromedp.Listen(ctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch ev := ev.(type) {
		case *network.EventRequestWillBeSent:
			requests = append(requests, ev.Request.URL)
		case *cdplog.EventEntryAdded:
			// A refused stylesheet (the CSP hash) or a failed load shows here.
			if ev.Entry.Level == cdplog.EntryLevelError || ev.Entry.Level == cdplog.EntryLevelWarning {
				problems = append(problems, string(ev.Entry.Source)+": "+ev.Entry.Text)
			}
		}
	}); err != nil {
		t.Fatalf("starting chromium (%s): %v", exe, err)
	}
	started := make(chan error, 1)
	go func() { started <- chromedp.Do(ctx) }()
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("starting chromium (%s): %v", exe, err)
		}
	case <-time.After(limit):
		cancel() // ends the start, which the goroutine then reports
		<-started
		t.Fatalf("chromium (%s) did not start within %v", exe, limit)
	}

	sctx, scancel := step()
	defer scancel()
	if err := chromedp.Do(sctx,
		chromedp.EmulateViewport(390, 844),
		chromedp.Navigate(base+"/?refresh=off"),
		chromedp.WaitVisible(chromedp.CSS(`[data-sensor="bench"] [data-quantity="temperature"] .value`)),
	); err != nil {
		t.Fatalf("loading the status page: %v", err)
	}

	texts := map[string]string{
		`#device`: "greenhouse-1",
		`[data-sensor="bench"] [data-quantity="temperature"] .value`: "21.5",
		`[data-sensor="bench"] [data-quantity="temperature"] .unit`:  "°C",
		`[data-sensor="bench"] [data-quantity="pressure"] .value`:    "1013.2",
		`[data-sensor="bench"] .state`:                               "ok",
		`[data-sensor="tank"] [data-quantity="level"] .value`:        "1.75",
		`[data-sensor="tank"] .state`:                                "failing",
		`[data-bridge="cloud"] .state`:                               "connected",
		`[data-bridge="cloud"] .depth`:                               "12",
		`[data-bridge="backup"] .state`:                              "down",
		`[data-output="pump"] button`:                                "OFF",
		`[data-output="fan"] button`:                                 "ON",
	}
	for sel, want := range texts {
		got, err := chromedp.Run(sctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Errorf("reading %s: %v", sel, err)
			continue
		}
		if strings.TrimSpace(got) != want {
			t.Errorf("%s shows %q, want %q", sel, got, want)
		}
	}

	// The stylesheet applied (the CSP admits it by hash), the sparkline is
	// drawn, and a phone gets one column.
	type layout struct {
		Display   string `json:"display"`
		Columns   int    `json:"columns"`
		SparkW    int    `json:"sparkW"`
		SparkPts  int    `json:"sparkPts"`
		Overflows bool   `json:"overflows"`
	}
	const measure = `(() => {
		const main = document.querySelector('main');
		const lefts = new Set([...document.querySelectorAll('main > section')].map(s => Math.round(s.getBoundingClientRect().left)));
		const spark = document.querySelector('[data-sensor="bench"] [data-quantity="temperature"] svg');
		return {
			display: getComputedStyle(main).display,
			columns: lefts.size,
			sparkW: spark ? Math.round(spark.getBoundingClientRect().width) : 0,
			sparkPts: spark ? [...spark.querySelectorAll('polyline')].reduce((n, p) => n + p.points.numberOfItems, 0) : 0,
			overflows: document.documentElement.scrollWidth > window.innerWidth,
		};
	})()`
	phone, err := chromedp.Run(sctx, chromedp.Evaluate[layout](measure))
	if err != nil {
		t.Fatalf("measuring the layout: %v", err)
	}
	if phone.Display != "grid" {
		t.Errorf("main is display %q, want grid: the stylesheet did not apply", phone.Display)
	}
	if phone.Columns != 1 {
		t.Errorf("at 390 px the sections are in %d columns, want 1", phone.Columns)
	}
	if phone.Overflows {
		t.Error("at 390 px the page is wider than the screen")
	}
	if phone.SparkW < 100 || phone.SparkPts < historySlots/2 {
		t.Errorf("the temperature sparkline is %d px wide with %d points, want a drawn line", phone.SparkW, phone.SparkPts)
	}

	shot, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	path := filepath.Join(t.TempDir(), "status.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	checkScreenshot(t, path, 390)

	sctx, scancel = step()
	defer scancel()
	if err := chromedp.Do(sctx, chromedp.EmulateViewport(1000, 800)); err != nil {
		t.Fatal(err)
	}
	laptop, err := chromedp.Run(sctx, chromedp.Evaluate[layout](measure))
	if err != nil {
		t.Fatalf("measuring the layout: %v", err)
	}
	if laptop.Columns != 2 {
		t.Errorf("at 1000 px the sections are in %d columns, want 2", laptop.Columns)
	}

	// Click the pump's switch: the form posts to /outputs/pump, the
	// gateway is asked to turn it on, and the page comes back showing it on.
	sctx, scancel = step()
	defer scancel()
	if err := chromedp.Do(sctx, chromedp.Click(chromedp.CSS(`[data-output="pump"] button`))); err != nil {
		t.Fatalf("clicking the pump's switch: %v", err)
	}
	select {
	case c := <-f.switched:
		if c != (setCall{"pump", true}) {
			t.Errorf("the click called SetOutput(%q, %v), want pump on", c.name, c.on)
		}
	case <-sctx.Done():
		t.Fatalf("the click did not reach SetOutput within %v", limit)
	}
	sctx, scancel = step()
	defer scancel()
	if err := chromedp.Do(sctx, chromedp.WaitVisible(chromedp.CSS(`[data-output="pump"] button[aria-checked="true"]`))); err != nil {
		t.Fatalf("the page does not show the pump on after the switch: %v", err)
	}
	url, err := chromedp.Run(sctx, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	if url != base+"/" {
		t.Errorf("after the switch the browser is at %s, want %s/", url, base)
	}

	mu.Lock()
	defer mu.Unlock()
	for _, u := range requests {
		if !strings.HasPrefix(u, base+"/") && !strings.HasPrefix(u, "data:") {
			t.Errorf("the page loaded %s, which is not ours", u)
		}
	}
	if len(requests) < 3 {
		t.Errorf("saw %d requests (%v), want the page, the post and the page again", len(requests), requests)
	}
	for _, p := range problems {
		t.Errorf("browser console: %s", p)
	}
}

// checkScreenshot checks that path is a PNG of a phone-wide page taller
// than one screen, and that it is not blank.
func checkScreenshot(t *testing.T, path string, cssWidth int) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) < 10<<10 || len(data) > 20<<20 {
		t.Errorf("screenshot is %d bytes; a full page should be 10 KiB to 20 MiB", len(data))
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("screenshot %s is not a PNG: %v", path, err)
	}
	b := img.Bounds()
	if b.Dx() < cssWidth || b.Dx() > 3*cssWidth || b.Dy() < 844 {
		t.Errorf("screenshot is %dx%d, want %d px wide (at most 3x for a dense screen) and longer than one screen", b.Dx(), b.Dy(), cssWidth)
	}
	// The most common colour is the background; the page must have a fair
	// share of other pixels: text, cards, badges, the sparkline.
	counts := map[color.RGBA]int{}
	for y := b.Min.Y; y < b.Max.Y; y += 2 {
		for x := b.Min.X; x < b.Max.X; x += 2 {
			r, g, bl, _ := img.At(x, y).RGBA()
			counts[color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(bl >> 8), 255}]++
		}
	}
	var bg color.RGBA
	total, most := 0, 0
	for c, n := range counts {
		total += n
		if n > most {
			bg, most = c, n
		}
	}
	other := 0
	for c, n := range counts {
		if far(c, bg) {
			other += n
		}
	}
	share := float64(other) / float64(total)
	t.Logf("screenshot %s: %dx%d, %d bytes, %d colours, %.1f%% away from the background %v", path, b.Dx(), b.Dy(), len(data), len(counts), 100*share, bg)
	if share < 0.02 || len(counts) < 16 {
		t.Errorf("the screenshot looks blank: %.2f%% of pixels differ from the background, %d colours", 100*share, len(counts))
	}
}

// far reports whether two colours differ by more than anti-aliasing noise.
func far(a, b color.RGBA) bool {
	d := func(x, y uint8) int {
		if x > y {
			return int(x - y)
		}
		return int(y - x)
	}
	return d(a.R, b.R)+d(a.G, b.G)+d(a.B, b.B) > 24
}
