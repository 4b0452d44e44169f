package ops

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

//go:embed status.html
var statusHTML string

//go:embed status.css
var statusCSS string

var statusTemplate = template.Must(template.New("status").Parse(statusHTML))

// statusCSP allows the page nothing but its own inline stylesheet, named
// by its hash, and forms posted back to us: no scripts, no fetches, no
// external assets, no framing.
var statusCSP = func() string {
	sum := sha256.Sum256([]byte(statusCSS))
	return "default-src 'none'; style-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) +
		"'; img-src data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
}()

// refreshSeconds is the status page's reload interval.
const refreshSeconds = 10

// statusPage is what the template renders.
type statusPage struct {
	CSS                     template.CSS
	Refresh                 bool
	RefreshSeconds          int
	Name, Version, Uptime   string
	Ready                   bool
	Why                     string
	Broker                  BrokerStats
	StorageSize             string
	Sensors                 []sensorView
	Outputs                 []outputView
	Switch                  switchView
	Bridges                 []bridgeView
	Clients                 []Client
	SparkWidth, SparkHeight int
}

type sensorView struct {
	Name, Kind string
	OK         bool
	Values     []valueView
	Read       bool
	Age        string
	Reads      uint64
	Failed     uint64
	LastError  string
}

type valueView struct {
	Quantity, Unit, Text string
	HasSpark             bool
	Spark                sparkline
	Low, High            string
}

type outputView struct {
	Name   string
	On     bool
	Next   string // on or off: what the switch does
	Action string
}

type switchView struct {
	Enabled    bool
	TokenField bool
	Note       string
}

type bridgeView struct {
	Name, State, Class   string
	Since                string
	Depth                int
	Bytes, Oldest        string
	Sent, Acked, Inbound uint64
	LastError            string
	DeadLetters          int
	DeadBytes            string
	Dead                 []deadView // the newest few
	// Link says how the link goes when that is not the plain case: the
	// protocol learned, a QoS lowered, attempts failing in a row.
	Link string
}

type deadView struct {
	Seq           uint64
	Topic, Reason string
	Age           string
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	now := s.now()
	id := call(s.src.Identity)
	p := statusPage{
		CSS:            template.CSS(statusCSS),
		Refresh:        r.URL.Query().Get("refresh") != "off",
		RefreshSeconds: refreshSeconds,
		Name:           id.Name,
		Version:        id.Version,
		Broker:         call(s.src.Broker),
		StorageSize:    formatBytes(call(s.src.Storage).FileBytes),
		Clients:        call(s.src.Clients),
		SparkWidth:     sparkWidth,
		SparkHeight:    sparkHeight,
	}
	if p.Name == "" {
		p.Name = "fieldgate"
	}
	if !id.Started.IsZero() {
		p.Uptime = formatAge(now.Sub(id.Started))
	}
	p.Ready, p.Why = s.ready()
	for _, sn := range call(s.src.Sensors) {
		v := sensorView{Name: sn.Name, Kind: sn.Kind, OK: sn.OK, Reads: sn.Reads, LastError: sn.LastError}
		for _, n := range sn.Failures {
			v.Failed += n
		}
		if !sn.LastRead.IsZero() {
			v.Read, v.Age = true, formatAge(now.Sub(sn.LastRead))
		}
		for _, q := range sn.Values {
			vv := valueView{Quantity: q.Quantity, Unit: q.Unit, Text: formatValue(q.Value)}
			if sp, ok := s.hist.sparkline(sn.Name, q.Quantity, now); ok {
				vv.HasSpark, vv.Spark = true, sp
				vv.Low, vv.High = formatValue(sp.Min), formatValue(sp.Max)
			}
			v.Values = append(v.Values, vv)
		}
		p.Sensors = append(p.Sensors, v)
	}
	p.Switch = s.switchView()
	for _, o := range call(s.src.Outputs) {
		next := "on"
		if o.On {
			next = "off"
		}
		p.Outputs = append(p.Outputs, outputView{Name: o.Name, On: o.On, Next: next, Action: "/outputs/" + url.PathEscape(o.Name)})
	}
	for _, b := range call(s.src.Bridges) {
		v := bridgeView{Name: b.Name, State: b.State, Class: "warn", Depth: b.Depth, Bytes: formatBytes(b.Bytes),
			Sent: b.Sent, Acked: b.Acked, Inbound: b.Inbound, LastError: b.LastError}
		switch b.State {
		case "connected":
			v.Class = "ok"
		case "down":
			v.Class = "bad"
		}
		if !b.Since.IsZero() {
			v.Since = formatAge(now.Sub(b.Since)) + " ago"
		}
		if b.Depth > 0 && b.OldestAge > 0 {
			v.Oldest = formatAge(b.OldestAge) + " old"
		}
		v.Link = linkNote(b)
		if b.DeadLetters > 0 {
			v.DeadLetters, v.DeadBytes = b.DeadLetters, formatBytes(b.DeadLetterBytes)
			if s.src.DeadLetters != nil {
				dead, err := s.src.DeadLetters(b.Name, statusDeadLetters)
				if err != nil {
					s.log.Warn("status page: reading dead letters failed", "bridge", b.Name, "err", err)
				}
				for i := len(dead) - 1; i >= 0; i-- { // newest first
					d := dead[i]
					v.Dead = append(v.Dead, deadView{Seq: d.Seq, Topic: d.Topic, Reason: d.Reason, Age: formatAge(now.Sub(d.At)) + " ago"})
				}
			}
		}
		p.Bridges = append(p.Bridges, v)
	}
	slices.SortFunc(p.Clients, func(a, b Client) int { return strings.Compare(a.ID, b.ID) })

	var buf bytes.Buffer
	if err := statusTemplate.Execute(&buf, p); err != nil {
		s.log.Error("status page failed to render", "err", err)
		plain(w, http.StatusInternalServerError, "the status page failed to render; see the log\n")
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", statusCSP)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	_, _ = w.Write(buf.Bytes())
}

// formatValue writes a reading with up to six significant digits and
// never in exponent form, which reads badly on a dashboard.
func formatValue(v float64) string {
	s := strconv.FormatFloat(v, 'g', 6, 64)
	if strings.ContainsRune(s, 'e') {
		s = strconv.FormatFloat(v, 'f', -1, 64)
	}
	return s
}

// formatAge writes d in its two largest units: 45s, 3m 20s, 5h 2m, 12d 4h.
func formatAge(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	sec := int64(d / time.Second)
	switch {
	case sec < 60:
		return fmt.Sprintf("%ds", sec)
	case sec < 3600:
		return fmt.Sprintf("%dm %ds", sec/60, sec%60)
	case sec < 86400:
		return fmt.Sprintf("%dh %dm", sec/3600, sec%3600/60)
	}
	return fmt.Sprintf("%dd %dh", sec/86400, sec%86400/3600)
}

// formatBytes writes n in B, KiB, MiB or GiB with one decimal.
func formatBytes(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v, unit := float64(n)/1024, "KiB"
	for _, u := range []string{"MiB", "GiB"} {
		if v < 1024 {
			break
		}
		v, unit = v/1024, u
	}
	return fmt.Sprintf("%.1f %s", v, unit)
}

// linkNote describes what a bridge's link learned or is going through:
// empty for a healthy MQTT 5 link that sends every QoS.
func linkNote(b Bridge) string {
	var parts []string
	if b.Protocol == 4 {
		parts = append(parts, "MQTT 3.1.1")
	}
	if b.QoSLimit > 0 && b.QoSLimit < 2 {
		parts = append(parts, fmt.Sprintf("QoS %d at most", b.QoSLimit))
	}
	if b.Failing > 0 {
		parts = append(parts, fmt.Sprintf("%d attempts in a row delivered nothing", b.Failing))
	}
	return strings.Join(parts, ", ")
}
