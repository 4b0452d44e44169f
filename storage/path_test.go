package storage

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestOpenPathKinds opens state paths that are not plain files: each is
// refused with an error that names the path and what it is, and nothing
// is created, except through a link to an existing file, which is used.
func TestOpenPathKinds(t *testing.T) {
	dir := t.TempDir()
	isDir := filepath.Join(dir, "state.d")
	if err := os.Mkdir(isDir, 0o700); err != nil {
		t.Fatal(err)
	}
	dangling := filepath.Join(dir, "dangling.db")
	target := filepath.Join(dir, "target.db")
	if err := os.Symlink(target, dangling); err != nil {
		t.Fatal(err)
	}
	toDir := filepath.Join(dir, "todir.db")
	if err := os.Symlink(isDir, toDir); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, path string
		want       []string
	}{
		{"a directory", isDir, []string{isDir, "is a directory", "storage.path"}},
		{"a dangling link", dangling, []string{dangling, "symbolic link", target, "does not exist"}},
		{"a link to a directory", toDir, []string{toDir, "is a directory"}},
	} {
		for _, open := range []struct {
			name string
			fn   func(string) error
		}{
			{"Open", func(p string) error {
				db, err := Open(p, Options{})
				if err == nil {
					db.Close()
				}
				return err
			}},
			{"OpenReadOnly", func(p string) error {
				db, err := OpenReadOnly(p)
				if err == nil {
					db.Close()
				}
				return err
			}},
		} {
			err := open.fn(c.path)
			if err == nil {
				t.Errorf("%s of %s: no error", open.name, c.name)
				continue
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s of %s: %q does not say %q", open.name, c.name, err, w)
				}
			}
			if strings.Contains(err.Error(), "truncated") {
				t.Errorf("%s of %s: %q calls it truncated", open.name, c.name, err)
			}
		}
	}
	if _, err := os.Lstat(target); err == nil {
		t.Errorf("opening a dangling link created its target %s", target)
	}

	// A link to an existing state file is followed.
	real := filepath.Join(dir, "real.db")
	db, err := Open(real, Options{})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	link := filepath.Join(dir, "link.db")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	db, err = Open(link, Options{})
	if err != nil {
		t.Fatalf("a link to an existing state file: %v", err)
	}
	db.Close()
}

// TestOpenLocked: a file another process (here another DB) holds is
// refused after the lock timeout with an error that says so and wraps
// ErrLocked, read only or not.
func TestOpenLocked(t *testing.T) {
	db := openTemp(t, Options{})
	_, err := Open(db.Path(), Options{LockTimeout: 50 * time.Millisecond})
	errIs(t, err, ErrLocked)
	if !strings.Contains(err.Error(), db.Path()) || !strings.Contains(err.Error(), "locked by another process") {
		t.Errorf("error %q does not name the file and the lock", err)
	}
	_, err = OpenReadOnly(db.Path())
	errIs(t, err, ErrLocked)
}
