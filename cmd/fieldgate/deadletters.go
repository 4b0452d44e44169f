package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fieldgate/fieldgate/gateway/bridge"
	"github.com/fieldgate/fieldgate/gateway/config"
	"github.com/fieldgate/fieldgate/gateway/ops"
	"github.com/fieldgate/fieldgate/sensors"
	"github.com/fieldgate/fieldgate/storage"
)

// fieldgate db deadletters lists a bridge's dead letters, the messages
// its upstream kept refusing, and retries or drops them. With the
// gateway stopped it works on the state file itself; a running gateway
// holds the file's lock, and then the command asks the gateway's ops
// endpoint (on loopback when it listens on every address) with the
// configuration's ops.token, so that the gateway's own bridge, with its
// counters, does the work. The configuration names both the file and
// the endpoint, and the bridges' routes a retry queues under.

const deadLettersUsage = `usage: fieldgate db deadletters [list] [-config FILE] [-path STATE.db] [-bridge NAME] [-limit N]
       fieldgate db deadletters retry|drop [-config FILE] [-path STATE.db] [-bridge NAME] (-all | SEQ...)`

// opsTimeout bounds a request to the running gateway's ops endpoint: a
// retry of thousands of dead letters is a few commits on an SD card.
const opsTimeout = 60 * time.Second

// payloadShown is how much of a payload the listing quotes.
const payloadShown = 40

// cmdDeadLetters runs fieldgate db deadletters.
func cmdDeadLetters(args []string, stdout, stderr io.Writer) int {
	action := "list"
	if len(args) > 0 && (args[0] == "list" || args[0] == "retry" || args[0] == "drop") {
		action, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("fieldgate db deadletters "+action, flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "configuration `FILE` naming storage.path, the bridges and ops.address (default: the embedded configuration)")
	path := fs.String("path", "", "the state `FILE` itself, instead of the one the configuration names")
	name := fs.String("bridge", "", "the bridge `NAME` (default: every bridge to list; the only one configured to retry or drop)")
	limit := fs.Int("limit", 0, "list at most the newest `N` of each bridge (0: all, or as many as a running gateway lists at once)")
	all := fs.Bool("all", false, "retry or drop every dead letter of the bridge")
	// Flags and sequence numbers may come in any order.
	var seqs []uint64
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			return exitUsage
		}
		rest = fs.Args()
		for len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
			if action == "list" {
				fmt.Fprintf(stderr, "fieldgate db deadletters: unexpected argument %q\n%s\n", rest[0], deadLettersUsage)
				return exitUsage
			}
			for f := range strings.SplitSeq(rest[0], ",") {
				n, err := strconv.ParseUint(f, 10, 64)
				if err != nil || n == 0 {
					fmt.Fprintf(stderr, "fieldgate db deadletters %s: %q is not a dead letter's number (1 or more, as the list shows)\n", action, f)
					return exitUsage
				}
				seqs = append(seqs, n)
			}
			rest = rest[1:]
		}
		if len(rest) == 0 {
			break
		}
	}
	if action != "list" && *all == (len(seqs) > 0) {
		fmt.Fprintf(stderr, "fieldgate db deadletters %s: name the dead letters by number, or give -all, not both\n%s\n", action, deadLettersUsage)
		return exitUsage
	}
	if *limit < 0 {
		fmt.Fprintf(stderr, "fieldgate db deadletters: -limit %d is negative\n", *limit)
		return exitUsage
	}
	var cargs []string
	if *cfgPath != "" {
		cargs = []string{"-config", *cfgPath}
	}
	cfg, _, code := loadConfig("db deadletters", cargs, stderr)
	if cfg == nil {
		return code
	}
	file := *path
	if file == "" {
		file = cfg.Storage.Path
	}
	d := &deadLetterCmd{cfg: cfg, file: file, bridge: *name, limit: *limit, stdout: stdout, stderr: stderr}
	if action == "list" {
		return d.list()
	}
	return d.act(action, seqs)
}

// deadLetterCmd is one run of fieldgate db deadletters.
type deadLetterCmd struct {
	cfg            *config.Config
	file, bridge   string
	limit          int
	stdout, stderr io.Writer
}

// row is one dead letter as the listing prints it, read from the file or
// from the endpoint.
type row struct {
	bridge        string
	seq           uint64
	at            time.Time
	failures      int
	qos           byte
	topic, reason string
	payload       []byte
}

func (d *deadLetterCmd) fail(format string, args ...any) int {
	fmt.Fprintf(d.stderr, "fieldgate db deadletters: "+format+"\n", args...)
	return exitFail
}

func (d *deadLetterCmd) list() int {
	db, err := storage.OpenReadOnly(d.file)
	if errors.Is(err, storage.ErrLocked) {
		return d.listRunning()
	}
	if err != nil {
		return d.fail("%v", err)
	}
	defer db.Close()
	names := []string{d.bridge}
	if d.bridge == "" {
		st, err := db.Stats()
		if err != nil {
			return d.fail("%v", err)
		}
		names = names[:0]
		for _, b := range st.DeadLetters {
			names = append(names, b.Bridge)
		}
	}
	var rows []row
	for _, name := range names {
		add := func(l storage.DeadLetter) {
			rows = append(rows, row{bridge: name, seq: l.Seq, at: time.Unix(0, l.At), failures: l.Failures, qos: l.Entry.Msg.QoS,
				topic: l.Entry.Msg.Topic, reason: l.Reason, payload: l.Entry.Msg.Payload})
		}
		if d.limit > 0 {
			list, err := db.DeadLetterNewest(name, d.limit)
			if err != nil {
				return d.fail("%v", err)
			}
			for _, l := range list {
				add(l)
			}
			continue
		}
		err := db.DeadLetterScan(name, 0, 0, func(l *storage.DeadLetter) bool { add(*l); return true })
		var bad *storage.OutboxDecodeError
		if errors.As(err, &bad) {
			fmt.Fprintf(d.stderr, "fieldgate db deadletters: %v; drop them by number\n", err)
		} else if err != nil {
			return d.fail("%v", err)
		}
	}
	return d.print(rows)
}

// print writes the listing, or says there is nothing.
func (d *deadLetterCmd) print(rows []row) int {
	if len(rows) == 0 {
		where := d.file
		if d.bridge != "" {
			where = "bridge " + d.bridge + " in " + where
		}
		fmt.Fprintf(d.stdout, "no dead letters: %s\n", where)
		return 0
	}
	tw := tabwriter.NewWriter(d.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "bridge\tseq\tmoved\tfailures\tqos\tbytes\ttopic\treason\tpayload")
	for _, r := range rows {
		p := r.payload
		more := ""
		if len(p) > payloadShown {
			p, more = p[:payloadShown], "…"
		}
		reason := strings.Map(func(c rune) rune {
			if c == '\t' || c == '\n' {
				return ' '
			}
			return c
		}, r.reason)
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\t%s\t%s\t%s%s\n", r.bridge, r.seq, r.at.UTC().Format(time.RFC3339), r.failures, r.qos,
			len(r.payload), strconv.Quote(r.topic), reason, strconv.Quote(string(p)), more)
	}
	if err := tw.Flush(); err != nil {
		return exitFail
	}
	return 0
}

// act retries or drops dead letters: on the file when the gateway is
// stopped, through the running gateway otherwise.
func (d *deadLetterCmd) act(action string, seqs []uint64) int {
	bc, code := d.bridgeConfig()
	if bc == nil {
		return code
	}
	db, err := storage.Open(d.file, storage.Options{LockTimeout: time.Second})
	if errors.Is(err, storage.ErrLocked) {
		return d.actRunning(action, bc.Name, seqs)
	}
	if err != nil {
		return d.fail("%v", err)
	}
	defer db.Close()
	// The gateway's own bridge, on the file, not started: the routes of
	// the configuration and the counts and logs of a running one.
	log := slog.New(slog.NewTextHandler(d.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	br, err := bridge.New(*bc, bridge.Options{Device: sensors.DeviceName(d.cfg.Gateway.Name), Store: db, Log: log})
	if err != nil {
		return d.fail("%v", err)
	}
	var n int
	if action == "retry" {
		n, err = br.RetryDeadLetters(seqs)
	} else {
		n, err = br.DropDeadLetters(seqs)
	}
	past := map[string]string{"retry": "retried", "drop": "dropped"}[action]
	fmt.Fprintf(d.stdout, "%s %d dead letters of bridge %s in %s\n", past, n, bc.Name, d.file)
	if err != nil {
		return d.fail("%v", err)
	}
	return 0
}

// bridgeConfig returns the configuration of the bridge named, or of the
// only one configured.
func (d *deadLetterCmd) bridgeConfig() (*bridge.Config, int) {
	var names []string
	for i := range d.cfg.Bridges {
		b := &d.cfg.Bridges[i]
		if b.Name == d.bridge || (d.bridge == "" && len(d.cfg.Bridges) == 1) {
			return b, 0
		}
		names = append(names, b.Name)
	}
	switch {
	case len(names) == 0:
		return nil, d.fail("the configuration has no bridges; pass the gateway's with -config")
	case d.bridge == "":
		return nil, d.fail("the configuration has %d bridges (%s); name one with -bridge", len(names), strings.Join(names, ", "))
	}
	return nil, d.fail("no bridge is named %q in the configuration; its bridges are: %s", d.bridge, strings.Join(names, ", "))
}

// opsBase returns the running gateway's ops endpoint as a base URL: on
// loopback when it listens on every address.
func (d *deadLetterCmd) opsBase() (string, error) {
	addr := d.cfg.Ops.Address
	if addr == "" {
		return "", fmt.Errorf("a running gateway holds %s, and ops.address is empty, so there is no endpoint to ask; stop the gateway (systemctl stop fieldgate) and run this again", d.file)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("ops.address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	return "http://" + net.JoinHostPort(host, port), nil
}

// request sends one request to the running gateway and returns its
// answer's status and body.
func (d *deadLetterCmd) request(method, path string, form url.Values) (int, []byte, error) {
	base, err := d.opsBase()
	if err != nil {
		return 0, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), opsTimeout)
	defer cancel()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, body)
	if err != nil {
		return 0, nil, err
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if tok := d.cfg.Ops.Token; tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("a running gateway holds %s; asking its ops endpoint %s failed: %w", d.file, base, err)
	}
	defer resp.Body.Close()
	// Bounded: a listing of the most the endpoint returns, payloads
	// included, fits many times over.
	out, err := io.ReadAll(io.LimitReader(resp.Body, 512<<20))
	return resp.StatusCode, out, err
}

func (d *deadLetterCmd) listRunning() int {
	names := []string{d.bridge}
	if d.bridge == "" {
		names = names[:0]
		for _, b := range d.cfg.Bridges {
			names = append(names, b.Name)
		}
	}
	var rows []row
	for _, name := range names {
		path := "/bridges/" + url.PathEscape(name) + "/dead-letters"
		if d.limit > 0 {
			path += "?limit=" + strconv.Itoa(d.limit)
		}
		code, body, err := d.request(http.MethodGet, path, nil)
		if err != nil {
			return d.fail("%v", err)
		}
		if code != http.StatusOK {
			return d.fail("bridge %s: the running gateway answered %d: %s", name, code, strings.TrimSpace(string(body)))
		}
		var list []ops.DeadLetter
		if err := json.Unmarshal(body, &list); err != nil {
			return d.fail("bridge %s: the running gateway's answer does not decode: %v", name, err)
		}
		if len(list) == bridge.MaxDeadLetterList {
			fmt.Fprintf(d.stderr, "fieldgate db deadletters: bridge %s: the running gateway lists the newest %d; stop it to list all\n", name, len(list))
		}
		for _, l := range list {
			rows = append(rows, row{bridge: name, seq: l.Seq, at: l.At, failures: l.Failures, qos: l.QoS, topic: l.Topic,
				reason: l.Reason, payload: l.Payload})
		}
	}
	return d.print(rows)
}

func (d *deadLetterCmd) actRunning(action, name string, seqs []uint64) int {
	form := url.Values{}
	if len(seqs) == 0 {
		form.Set("all", "true")
	}
	for _, s := range seqs {
		form.Add("seq", strconv.FormatUint(s, 10))
	}
	code, body, err := d.request(http.MethodPost, "/bridges/"+url.PathEscape(name)+"/dead-letters/"+action, form)
	if err != nil {
		return d.fail("%v", err)
	}
	if code != http.StatusOK {
		return d.fail("bridge %s: the running gateway answered %d: %s", name, code, strings.TrimSpace(string(body)))
	}
	fmt.Fprint(d.stdout, string(body))
	return 0
}
