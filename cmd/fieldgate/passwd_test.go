package main

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/fieldgate/fieldgate/gateway/broker/auth"
)

// passwd runs the passwd command in-process with stdin as its input.
func passwd(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := cmdPasswd(args, strings.NewReader(stdin), &stdout, &stderr)
	return result{stdout.String(), stderr.String(), code}
}

// cheapHash hashes at bcrypt's lowest cost, for files the test writes itself.
func cheapHash(t *testing.T, password string) string {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}

// checkPasswords loads the file and compares each user's password with want;
// an empty want means the user must not get in with "x".
func checkPasswords(t *testing.T, path string, want map[string]string) {
	t.Helper()
	p, err := auth.LoadPasswords(path)
	if err != nil {
		t.Fatal(err)
	}
	for user, pw := range want {
		if pw == "" {
			if p.Check(user, []byte("x")) {
				t.Errorf("%s: %q still gets in", path, user)
			}
			continue
		}
		if !p.Check(user, []byte(pw)) {
			t.Errorf("%s: password %q of %q refused", path, pw, user)
		}
	}
}

// wantFailure checks a failed run: its exit code, and one line on stderr
// holding every part of want.
func wantFailure(t *testing.T, r result, code int, want ...string) {
	t.Helper()
	if r.code != code {
		t.Errorf("exit code %d, want %d; stderr:\n%s", r.code, code, r.stderr)
	}
	if code == exitFail && strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("stderr is not one line:\n%s", r.stderr)
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
		}
	}
}

func TestPasswdSetAndReplace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "passwd")

	r := passwd(t, "s3cret\n", path, "sensor1")
	if r.code != 0 || r.stderr != "" || !strings.Contains(r.stdout, path) {
		t.Fatalf("set: code %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if fi, err := os.Stat(path); err != nil {
		t.Error(err)
	} else if fi.Mode().Perm() != 0o600 {
		t.Errorf("new file mode %v, want 0600", fi.Mode().Perm())
	}
	checkPasswords(t, path, map[string]string{"sensor1": "s3cret"})

	// A file kept by hand: comments and other users stay as they were.
	other := "# plant sensors\n\npump:" + cheapHash(t, "pump pw") + "\n"
	if err := os.WriteFile(path, []byte(other+"sensor1:"+cheapHash(t, "old")+"\n# end\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Without a final newline, and with a Windows line ending.
	for _, in := range []string{"new pw", "new pw\r\n"} {
		if r := passwd(t, in, path, "sensor1"); r.code != 0 {
			t.Fatalf("replace with %q: code %d, stderr %q", in, r.code, r.stderr)
		}
		content, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(content), other+"sensor1:$2a$") || !strings.HasSuffix(string(content), "\n# end\n") {
			t.Errorf("other lines changed:\n%s", content)
		}
		checkPasswords(t, path, map[string]string{"sensor1": "new pw", "pump": "pump pw"})
	}
}

func TestPasswdDelete(t *testing.T) {
	path := filepath.Join(t.TempDir(), "passwd")
	content := "# users\npump:" + cheapHash(t, "p") + "\nvalve:" + cheapHash(t, "v") + "\n"
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	r := passwd(t, "", "-D", path, "pump")
	if r.code != 0 || !strings.Contains(r.stdout, `deleted "pump"`) {
		t.Fatalf("delete: code %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	checkPasswords(t, path, map[string]string{"pump": "", "valve": "v"})

	wantFailure(t, passwd(t, "", "-D", path, "pump"), exitFail, path, `"pump"`, "no such user")

	missing := filepath.Join(t.TempDir(), "passwd")
	wantFailure(t, passwd(t, "", "-D", missing, "pump"), exitFail, missing, "no such file")
	if _, err := os.Stat(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("-D created the file (%v)", err)
	}
}

func TestPasswdRefuses(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "passwd")
	tests := []struct {
		name  string
		stdin string
		user  string
		want  []string
	}{
		{"colon in username", "pw\n", "a:b", []string{path, `"a:b"`, "contains ':'"}},
		{"username starting with #", "pw\n", "#x", []string{path, "begins with '#'"}},
		{"control character", "pw\n", "a\tb", []string{path, "control character U+0009"}},
		{"empty password", "\n", "bob", []string{path, `"bob"`, "the password is empty"}},
		{"no input", "", "bob", []string{path, "the password is empty"}},
		{"73 bytes", strings.Repeat("p", 73) + "\n", "bob", []string{path, "longer than 72 bytes"}},
		{"endless line", strings.Repeat("p", 5000), "bob", []string{path, "longer than 1024 bytes"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantFailure(t, passwd(t, tt.stdin, path, tt.user), exitFail, tt.want...)
			if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("a refused entry created the file (%v)", err)
			}
		})
	}
}

func TestPasswdUsage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "passwd")
	for _, args := range [][]string{
		nil,
		{path},
		{path, "bob", "extra"},
		{"-D", path},
		{"-x", path, "bob"},
		{path, "bob", "-D"}, // flags come first
	} {
		r := passwd(t, "pw\n", args...)
		wantFailure(t, r, exitUsage, "usage: fieldgate passwd [-D] FILE USER")
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a usage error created the file (%v)", err)
	}

	var stdout, stderr bytes.Buffer
	if code := dispatch([]string{"help"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "passwd [-D] FILE USER") {
		t.Errorf("help (code %d) does not list passwd:\n%s", code, stdout.String())
	}
}

// TestPasswdTerminalHint feeds a character device, as a terminal is, and
// expects the note on hiding the password before the prompt.
func TestPasswdTerminalHint(t *testing.T) {
	tty, err := os.Open(os.DevNull)
	if err != nil {
		t.Skip(err)
	}
	defer tty.Close()
	path := filepath.Join(t.TempDir(), "passwd")
	var stdout, stderr bytes.Buffer
	code := cmdPasswd([]string{path, "bob"}, tty, &stdout, &stderr)
	if code != exitFail || !strings.Contains(stderr.String(), "fieldgate passwd -h") || !strings.Contains(stderr.String(), "Password: ") {
		t.Errorf("code %d, stderr:\n%s", code, stderr.String())
	}
}

// TestPasswdBinary runs the shipped binary the way a provisioning script
// does: echo secret | fieldgate passwd FILE USER.
func TestPasswdBinary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "passwd")
	cmd := exec.Command(binary, "passwd", path, "gate")
	cmd.Stdin = strings.NewReader("secret\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	checkPasswords(t, path, map[string]string{"gate": "secret"})
}
