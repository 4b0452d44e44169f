package main

import (
	"bufio"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/fieldgate/fieldgate/gateway/config"
)

// The .deb installs packaging/fieldgate.yaml as /etc/fieldgate/fieldgate.yaml,
// the file fieldgate.service runs on. These tests keep it valid, keep it
// closed to the network, and keep it in step with the units in systemd/;
// and they keep the manual page, packaging/fieldgate.1, in step with the
// commands.

const (
	packagedConfig  = "../../packaging/fieldgate.yaml"
	manPage         = "../../packaging/fieldgate.1"
	serviceUnit     = "../../systemd/fieldgate.service"
	socketUnit      = "../../systemd/fieldgate.socket"
	imageConfig     = "../../image/fieldgate-default.yaml"
	installedConfig = "/etc/fieldgate/fieldgate.yaml"
)

func TestPackagedConfigChecks(t *testing.T) {
	r := runBinary(t, "check", "-config", packagedConfig)
	if r.code != 0 || r.stdout != "ok: "+packagedConfig+"\n" {
		t.Fatalf("fieldgate check -config %s: exit %d\nstdout:\n%s\nstderr:\n%s", packagedConfig, r.code, r.stdout, r.stderr)
	}
}

func TestPackagedConfigIsAnInstalledGateway(t *testing.T) {
	cfg, err := config.Load(packagedConfig)
	if err != nil {
		t.Fatal(err)
	}

	// The service runs on the conffile's path.
	if exec := unitValue(t, serviceUnit, "ExecStart"); !strings.Contains(exec, " -config "+installedConfig) {
		t.Errorf("%s: ExecStart=%s does not run on %s", serviceUnit, exec, installedConfig)
	}

	// State goes where the unit's StateDirectory= puts it: systemd makes
	// /var/lib/NAME (with DynamicUser=, a link to /var/lib/private/NAME)
	// and lets the service write only there.
	stateDir := unitValue(t, serviceUnit, "StateDirectory")
	if want := "/var/lib/" + stateDir + "/state.db"; cfg.Storage.Path != want {
		t.Errorf("storage.path = %q, want %q, in StateDirectory=%s", cfg.Storage.Path, want, stateDir)
	}

	// Closed to the network: anonymous clients only with every listener on
	// loopback, and the ops endpoint (which lets a loopback client switch
	// outputs without credentials) on loopback too.
	if len(cfg.Listeners) == 0 {
		t.Error("no listeners: an installed gateway serves MQTT")
	}
	for _, l := range cfg.Listeners {
		if !onLoopback(l.Address) {
			t.Errorf("listener %s on %s, want a loopback address in the installed configuration", l.Name, l.Address)
		}
	}
	if !cfg.Broker.AllowAnonymous {
		t.Error("allow_anonymous is off: on loopback only, local clients should work out of the box")
	}
	if !onLoopback(cfg.Ops.Address) {
		t.Errorf("ops.address = %q, want a loopback address", cfg.Ops.Address)
	}

	// The socket unit names its socket after the listener it replaces.
	name := unitValue(t, socketUnit, "FileDescriptorName")
	if len(cfg.Listeners) == 0 || cfg.Listeners[0].Name != name {
		t.Errorf("fieldgate.socket passes a socket named %q, but the first listener is not named so", name)
	}

	// Hardware is site-specific: nothing is polled or driven, nothing is
	// sent upstream, until the site's configuration says so.
	if n := len(cfg.Sensors) + len(cfg.Outputs) + len(cfg.Bridges); n != 0 {
		t.Errorf("%d sensors, outputs and bridges, want none", n)
	}
}

// TestPackagedDefaultsAdmitNoAnonymousNetworkClient reads the files the
// package and the image ship: the socket unit binds loopback only, whatever
// the configuration allows, since it replaces the listener's address; and
// the configurations that admit anonymous clients (the package's conffile
// and the image's stand-in for it) do so on loopback only, so that neither
// fieldgate check nor the start log has anything to warn about.
func TestPackagedDefaultsAdmitNoAnonymousNetworkClient(t *testing.T) {
	streams := unitValues(t, socketUnit, "ListenStream")
	if len(streams) == 0 {
		t.Errorf("%s: no ListenStream=", socketUnit)
	}
	for _, s := range streams {
		// A bare port, or a wildcard host, is every address of the board.
		if !onLoopback(s) {
			t.Errorf("%s: ListenStream=%s, want a loopback host:port such as 127.0.0.1:1883: the socket replaces the listener's address, and the packaged configuration admits anonymous clients", socketUnit, s)
		}
	}
	for _, path := range []string{packagedConfig, imageConfig} {
		cfg, err := config.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		if ws := cfg.Warnings(); len(ws) != 0 {
			t.Errorf("%s warns: %q", path, ws)
		}
		if !cfg.Broker.AllowAnonymous {
			continue
		}
		for _, l := range cfg.Listeners {
			if l.Type != "unix" && !onLoopback(l.Address) {
				t.Errorf("%s: anonymous clients allowed, and listener %s is on %s, not loopback", path, l.Name, l.Address)
			}
		}
		if r := runBinary(t, "check", "-config", path); r.code != 0 || strings.Contains(r.stderr, "WARNING") {
			t.Errorf("fieldgate check -config %s: exit %d\n%s", path, r.code, r.stderr)
		}
	}
}

// TestCheckWarnsOfAnonymousNetworkAccess: fieldgate check passes a file
// that admits anonymous clients on a network address, but says so, naming
// the file, line and key of the listener.
func TestCheckWarnsOfAnonymousNetworkAccess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lan.yaml")
	body := "broker:\n  allow_anonymous: true\nlisteners:\n  - name: lan\n    type: tcp\n    address: 0.0.0.0:1883\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runBinary(t, "check", "-config", path)
	want := "WARNING: " + path + ":6: listeners[0].address: 0.0.0.0:1883 listens on every address of the board, and broker.allow_anonymous (line 2) is on"
	if r.code != 0 || r.stdout != "ok: "+path+"\n" || !strings.HasPrefix(r.stderr, want) {
		t.Errorf("fieldgate check: exit %d\nstdout: %s\nstderr: %s\nwant stderr starting with %q", r.code, r.stdout, r.stderr, want)
	}
}

// TestPackagedConfigLANExample checks the commented broker and listeners
// sections that the file tells the user to put in place of its own to open
// the broker to the network: the result must be valid and refuse anonymous
// clients.
func TestPackagedConfigLANExample(t *testing.T) {
	data, err := os.ReadFile(packagedConfig)
	if err != nil {
		t.Fatal(err)
	}
	example := commentedExample(t, string(data), "# 3. ", "# 4. ")

	var doc, replacement map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(example), &replacement); err != nil {
		t.Fatalf("the example does not parse: %v\n%s", err, example)
	}
	for _, key := range []string{"broker", "listeners"} {
		if replacement[key] == nil {
			t.Fatalf("the example has no %s section:\n%s", key, example)
		}
		doc[key] = replacement[key]
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "lan.yaml")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}

	if r := runBinary(t, "check", "-config", path); r.code != 0 {
		t.Fatalf("fieldgate check on the file with the example in place: exit %d\n%s\n%s", r.code, r.stderr, out)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Broker.AllowAnonymous || cfg.Broker.PasswordFile == "" {
		t.Errorf("with the example in place: allow_anonymous %v, password_file %q; want off and a file", cfg.Broker.AllowAnonymous, cfg.Broker.PasswordFile)
	}
	if len(cfg.Listeners) != 1 || onLoopback(cfg.Listeners[0].Address) || cfg.Listeners[0].Name != "default" {
		t.Errorf("with the example in place: listeners %+v, want one named default on a network address", cfg.Listeners)
	}
}

// TestManPageListsEveryCommand: each command `fieldgate help` lists has its
// line in the manual page's synopsis.
func TestManPageListsEveryCommand(t *testing.T) {
	page, err := os.ReadFile(manPage)
	if err != nil {
		t.Fatal(err)
	}
	r := runBinary(t, "help")
	_, commands, ok := strings.Cut(r.stdout, "commands:\n")
	if !ok {
		t.Fatalf("help has no commands: section:\n%s", r.stdout)
	}
	n := 0
	for line := range strings.Lines(commands) {
		if !strings.HasPrefix(line, "  ") || strings.HasPrefix(line, "   ") {
			continue // a continuation, or the text after the list
		}
		cmd := strings.Fields(line)[0]
		n++
		if !strings.Contains(string(page), "\n.B fieldgate "+cmd) {
			t.Errorf("%s: no synopsis line for the command %q (\".B fieldgate %s\")", manPage, cmd, cmd)
		}
	}
	if n < 5 {
		t.Fatalf("found %d commands in help, want the whole list:\n%s", n, r.stdout)
	}
}

// commentedExample returns the YAML commented out between the line starting
// with from and the one starting with to: the lines indented past "#" by
// six spaces, with that prefix removed.
func commentedExample(t *testing.T, text, from, to string) string {
	t.Helper()
	const prefix = "#      "
	var b strings.Builder
	in := false
	for line := range strings.Lines(text) {
		switch {
		case strings.HasPrefix(line, from):
			in = true
		case strings.HasPrefix(line, to):
			in = false
		case in && strings.HasPrefix(line, prefix):
			b.WriteString(strings.TrimPrefix(line, prefix))
		}
	}
	if b.Len() == 0 {
		t.Fatalf("no commented example between %q and %q in %s", from, to, packagedConfig)
	}
	return b.String()
}

// onLoopback reports whether a host:port listens on loopback only.
func onLoopback(address string) bool {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// unitValue returns the value of the one assignment of key in a unit file.
func unitValue(t *testing.T, path, key string) string {
	t.Helper()
	values := unitValues(t, path, key)
	if len(values) != 1 {
		t.Fatalf("%s: %d assignments of %s, want one", path, len(values), key)
	}
	return values[0]
}

// unitValues returns the values of every assignment of key in a unit file,
// comments left out.
func unitValues(t *testing.T, path, key string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var values []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(s.Text()), key+"="); ok {
			values = append(values, v)
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return values
}
