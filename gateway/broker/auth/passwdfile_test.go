package auth

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// mustCheck loads the password file and checks one password in it.
func mustCheck(t *testing.T, path, user, password string) {
	t.Helper()
	p, err := LoadPasswords(path)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Check(user, []byte(password)) {
		t.Errorf("%s: password of %q refused", path, user)
	}
}

func TestSetPasswordCreates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "passwd")
	if err := SetPassword(path, "alice", []byte("wonderland")); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("new file mode %v, want 0600", fi.Mode().Perm())
	}
	content := readFile(t, path)
	if !strings.HasPrefix(content, "alice:$2a$") || strings.Count(content, "\n") != 1 || !strings.HasSuffix(content, "\n") {
		t.Errorf("new file holds %q, want one line alice:hash", content)
	}
	mustCheck(t, path, "alice", "wonderland")
	noTempFiles(t, filepath.Dir(path))
}

func noTempFiles(t *testing.T, dir string) {
	t.Helper()
	names, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.HasSuffix(n.Name(), ".tmp") {
			t.Errorf("temporary file %s left behind", n.Name())
		}
	}
}

func TestSetPasswordKeepsOtherLines(t *testing.T) {
	bob, carol := hash(t, "bob"), hash(t, "carol")
	tests := []struct {
		name   string
		before string
		user   string
		want   func(entry string) string // the file after, given the new entry
	}{
		{"replace in the middle",
			"# users\n\nbob:" + bob + "\n  \ncarol:" + carol + "\n",
			"bob",
			func(e string) string { return "# users\n\n" + e + "\n  \ncarol:" + carol + "\n" }},
		{"replace a CRLF line",
			"bob:" + bob + "\r\ncarol:" + carol + "\r\n",
			"bob",
			func(e string) string { return e + "\r\ncarol:" + carol + "\r\n" }},
		{"replace the last line without newline",
			"carol:" + carol + "\nbob:" + bob,
			"bob",
			func(e string) string { return "carol:" + carol + "\n" + e + "\n" }},
		{"replace a bad line and drop a duplicate",
			"bob:plaintext\ncarol:" + carol + "\nbob:" + bob + "\n",
			"bob",
			func(e string) string { return e + "\ncarol:" + carol + "\n" }},
		{"add at the end",
			"# users\ncarol:" + carol + "\n",
			"dave",
			func(e string) string { return "# users\ncarol:" + carol + "\n" + e + "\n" }},
		{"add after a last line without newline",
			"carol:" + carol,
			"dave",
			func(e string) string { return "carol:" + carol + "\n" + e + "\n" }},
		{"a commented-out entry stays",
			"#dave:" + bob + "\n",
			"dave",
			func(e string) string { return "#dave:" + bob + "\n" + e + "\n" }},
		{"empty file",
			"",
			"dave",
			func(e string) string { return e + "\n" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, tt.before)
			if err := SetPassword(path, tt.user, []byte("new")); err != nil {
				t.Fatal(err)
			}
			after := readFile(t, path)
			var entry string
			for _, line := range strings.Split(after, "\n") {
				if strings.HasPrefix(line, tt.user+":") {
					entry = strings.TrimSuffix(line, "\r")
				}
			}
			if want := tt.want(entry); after != want {
				t.Errorf("file after:\n%q\nwant:\n%q", after, want)
			}
			mustCheck(t, path, tt.user, "new")
			noTempFiles(t, filepath.Dir(path))
		})
	}
}

func TestSetPasswordKeepsModeAndLink(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real-passwd")
	if err := os.WriteFile(real, []byte("carol:"+hash(t, "c")+"\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(real, 0o640); err != nil { // whatever the umask
		t.Fatal(err)
	}
	link := filepath.Join(dir, "passwd")
	if err := os.Symlink("real-passwd", link); err != nil {
		t.Fatal(err)
	}
	if err := SetPassword(link, "bob", []byte("b")); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("the link was replaced by a file (%v)", err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want the file's 0640 kept", fi.Mode().Perm())
	}
	mustCheck(t, real, "bob", "b")
	mustCheck(t, real, "carol", "c")
}

func TestSetPasswordKeepsOwner(t *testing.T) {
	path := writeFile(t, "carol:"+hash(t, "c")+"\n")
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	uid, gid, ok := owner(fi)
	if !ok {
		t.Skip("this platform does not record file owners")
	}
	if uid != os.Getuid() || gid != os.Getgid() {
		t.Fatalf("owner reads %d:%d, want %d:%d", uid, gid, os.Getuid(), os.Getgid())
	}
	if os.Getuid() != 0 {
		t.Skip("only root can give a file to another owner")
	}
	// What the service user would own, edited by root.
	const svcUID, svcGID = 4242, 4343
	if err := os.Chown(path, svcUID, svcGID); err != nil {
		t.Fatal(err)
	}
	if err := SetPassword(path, "bob", []byte("b")); err != nil {
		t.Fatal(err)
	}
	if fi, err = os.Stat(path); err != nil {
		t.Fatal(err)
	}
	if uid, gid, _ = owner(fi); uid != svcUID || gid != svcGID {
		t.Errorf("owner %d:%d after the edit, want %d:%d kept", uid, gid, svcUID, svcGID)
	}
}

func TestSetPasswordRefuses(t *testing.T) {
	path := writeFile(t, "# untouched\n")
	tests := []struct {
		user, password string
		want           error
	}{
		{"a:b", "pw", ErrUsername},
		{"", "pw", ErrUsername},
		{"#x", "pw", ErrUsername},
		{"new\nline", "pw", ErrUsername},
		{"bob", "", ErrEmptyPassword},
		{"bob", strings.Repeat("p", 73), ErrPasswordTooLong},
	}
	for _, tt := range tests {
		err := SetPassword(path, tt.user, []byte(tt.password))
		if !errors.Is(err, tt.want) {
			t.Errorf("SetPassword(%q): %v, want %v", tt.user, err, tt.want)
			continue
		}
		if !strings.Contains(err.Error(), path) {
			t.Errorf("error %q does not name the file", err)
		}
	}
	if got := readFile(t, path); got != "# untouched\n" {
		t.Errorf("file changed to %q", got)
	}
	missing := filepath.Join(t.TempDir(), "passwd")
	if err := SetPassword(missing, "a:b", []byte("pw")); err == nil {
		t.Error("bad username accepted")
	}
	if _, err := os.Stat(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused entry created the file (%v)", err)
	}
}

func TestDeleteUser(t *testing.T) {
	bob, carol := hash(t, "bob"), hash(t, "carol")
	path := writeFile(t, "# users\nbob:"+bob+"\r\n\ncarol:"+carol+"\nbob:"+bob)
	if err := DeleteUser(path, "bob"); err != nil {
		t.Fatal(err)
	}
	if got, want := readFile(t, path), "# users\n\ncarol:"+carol+"\n"; got != want {
		t.Errorf("after delete:\n%q\nwant:\n%q", got, want)
	}
	mustCheck(t, path, "carol", "carol")

	err := DeleteUser(path, "bob")
	if !errors.Is(err, ErrNoUser) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), `"bob"`) {
		t.Errorf("deleting an absent user: %v, want ErrNoUser naming the file and user", err)
	}
	missing := filepath.Join(t.TempDir(), "passwd")
	err = DeleteUser(missing, "bob")
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Errorf("deleting from a missing file: %v, want fs.ErrNotExist naming it", err)
	}
	if _, err := os.Stat(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("DeleteUser created the file (%v)", err)
	}
	noTempFiles(t, filepath.Dir(path))
}
