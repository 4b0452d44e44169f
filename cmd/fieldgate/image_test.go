package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fieldgate/fieldgate/gateway/broker/auth"
	"github.com/fieldgate/fieldgate/gateway/config"
)

// The SD-card image configures itself at boot from files on the boot
// partition (image/rootfs/usr/lib/fieldgate-image/boot-config). These
// tests run that script on directories standing in for the card and the
// root filesystem, with this binary as fieldgate, and check the example
// the README gives for opening the broker to the network.

const (
	bootConfig     = "../../image/rootfs/usr/lib/fieldgate-image/boot-config"
	networkExample = "../../image/fieldgate-network.yaml"
)

// runBootConfig runs the script on boot and root and returns its output.
func runBootConfig(t *testing.T, boot, root string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		// It installs files owned by root, as it does at boot.
		t.Skip("boot-config installs files as root; run as root (make test does)")
	}
	cmd := exec.Command("bash", bootConfig)
	cmd.Env = append(os.Environ(),
		"FIELDGATE_BOOT_DIR="+boot, "FIELDGATE_ROOT_DIR="+root,
		"PATH="+filepath.Dir(binary)+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("boot-config: %v\n%s", err, out)
	}
	return string(out)
}

// TestImageFirstBootUsers: mqtt-users.txt on the boot partition becomes
// users in /etc/fieldgate/passwd (hashed, readable by the service) and
// leaves the card; together with the network example it gives a broker on
// every address that admits only those users. A file with a bad line is
// applied not at all, deleted, and explained without the passwords.
func TestImageFirstBootUsers(t *testing.T) {
	boot, root := t.TempDir(), t.TempDir()
	example, err := os.ReadFile(networkExample)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(boot, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("fieldgate.yaml", string(example))
	write("mqtt-users.txt", "# sensors\nsensor-1:first secret\n\nsensor-2:a:b:c\r\n")
	out := runBootConfig(t, boot, root)

	passwd := filepath.Join(root, "etc/fieldgate/passwd")
	fi, err := os.Stat(passwd)
	if err != nil {
		t.Fatalf("no password file after boot-config: %v\n%s", err, out)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("%s has mode %v, want 0644 (the service's dynamic user reads it)", passwd, fi.Mode().Perm())
	}
	users, err := auth.NewAuthenticator().LoadPasswords(passwd)
	if err != nil {
		t.Fatal(err)
	}
	for user, pw := range map[string]string{"sensor-1": "first secret", "sensor-2": "a:b:c"} {
		if !users.Check(user, []byte(pw)) {
			t.Errorf("%s cannot log in with the password from mqtt-users.txt", user)
		}
	}
	data, _ := os.ReadFile(passwd)
	if strings.Contains(string(data), "first secret") {
		t.Error("the password file holds a password in the clear")
	}
	for _, name := range []string{"mqtt-users.txt", "fieldgate.yaml"} {
		if _, err := os.Stat(filepath.Join(boot, name)); err == nil {
			t.Errorf("%s is still on the boot partition:\n%s", name, out)
		}
	}
	cfg, err := config.Load(filepath.Join(root, "etc/fieldgate/fieldgate.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if ws := cfg.Warnings(); len(ws) != 0 || cfg.Broker.AllowAnonymous || cfg.Broker.PasswordFile != "/etc/fieldgate/passwd" ||
		len(cfg.Listeners) != 1 || onLoopback(cfg.Listeners[0].Address) || cfg.Listeners[0].Name != "default" {
		t.Errorf("the network example: warnings %q, allow_anonymous %v, password_file %q, listeners %+v; want no warning, credentials from /etc/fieldgate/passwd, listener default on the network",
			ws, cfg.Broker.AllowAnonymous, cfg.Broker.PasswordFile, cfg.Listeners)
	}

	// A bad line: nothing applied, the file gone, the reason given.
	write("mqtt-users.txt", "sensor-3:third secret\nno colon here\n")
	runBootConfig(t, boot, root)
	if _, err := os.Stat(filepath.Join(boot, "mqtt-users.txt")); err == nil {
		t.Error("a rejected mqtt-users.txt stayed on the card, passwords and all")
	}
	users, err = auth.NewAuthenticator().LoadPasswords(passwd)
	if err != nil {
		t.Fatal(err)
	}
	if users.Check("sensor-3", []byte("third secret")) || !users.Check("sensor-1", []byte("first secret")) {
		t.Error("a rejected mqtt-users.txt changed the users")
	}
	why, err := os.ReadFile(filepath.Join(boot, "fieldgate-error.txt"))
	if err != nil || !strings.Contains(string(why), "line 2: not user:password") || strings.Contains(string(why), "secret") {
		t.Errorf("fieldgate-error.txt = %q, %v; want line 2 named and no password", why, err)
	}
}
