package auth

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
)

// SetPassword adds user to the password file at path, or replaces the
// user's entry, leaving every other line as it was. It creates the file,
// with mode 0600, when it is missing, and replaces it atomically.
func SetPassword(path, user string, password []byte) error {
	fail := func(err error) error {
		return fmt.Errorf("auth: set password of %q in %s: %w", user, path, err)
	}
	if err := ValidateUsername(user); err != nil {
		return fail(err)
	}
	hash, err := HashPassword(password)
	if err != nil {
		return fail(err)
	}
	if err := rewrite(path, user, user+":"+hash); err != nil {
		return fail(err)
	}
	return nil
}

// DeleteUser removes user's entry from the password file at path, leaving
// every other line as it was; it fails with ErrNoUser when there is none.
func DeleteUser(path, user string) error {
	if err := rewrite(path, user, ""); err != nil {
		return fmt.Errorf("auth: delete %q from %s: %w", user, path, err)
	}
	return nil
}

// rewrite replaces user's entries in the file at path with entry, or
// deletes them when entry is empty. A new entry for a user the file lacks
// goes at the end; a file that is missing is created only to add one.
func rewrite(path, user, entry string) error {
	// Replace the file a symbolic link points to, not the link.
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	var data []byte
	var old fs.FileInfo
	f, err := os.Open(path)
	switch {
	case err == nil:
		old, err = f.Stat()
		if err == nil {
			data, err = io.ReadAll(f)
		}
		f.Close()
		if err != nil {
			return err
		}
	case errors.Is(err, fs.ErrNotExist) && entry != "":
	default:
		return err
	}

	var out strings.Builder
	out.Grow(len(data) + len(entry) + 1)
	found := false
	for _, line := range strings.SplitAfter(string(data), "\n") {
		if u, _, isEntry, ok := splitEntry(line); !isEntry || !ok || u != user {
			out.WriteString(line)
			continue
		}
		if !found && entry != "" {
			out.WriteString(entry)
			if strings.HasSuffix(line, "\r\n") {
				out.WriteString("\r\n")
			} else {
				out.WriteString("\n")
			}
		}
		found = true
	}
	if !found {
		if entry == "" {
			return ErrNoUser
		}
		if out.Len() > 0 && !strings.HasSuffix(out.String(), "\n") {
			out.WriteString("\n")
		}
		out.WriteString(entry + "\n")
	}
	return writeAtomic(path, []byte(out.String()), old)
}

// writeAtomic replaces the file at path with data so that after a power cut
// the file holds either its old content or the new, never a mix. The new
// file keeps the permissions and owner of old, the file it replaces; with
// none it gets mode 0600.
func writeAtomic(path string, data []byte, old fs.FileInfo) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(tmp)
		}
	}()

	mode := fs.FileMode(0o600)
	if old != nil {
		mode = old.Mode().Perm()
	}
	if err := f.Chmod(mode); err != nil {
		return err
	}
	if err := keepOwner(f, old); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	err = f.Close()
	done = true
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	// The rename is durable only once the directory is.
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// keepOwner gives f the owner and group of old, so that a file the service
// user owns stays readable by it when root edits it.
func keepOwner(f *os.File, old fs.FileInfo) error {
	if old == nil {
		return nil
	}
	uid, gid, ok := owner(old)
	if !ok {
		return nil
	}
	now, err := f.Stat()
	if err != nil {
		return err
	}
	if u, g, ok := owner(now); ok && u == uid && g == gid {
		return nil
	}
	if err := f.Chown(uid, gid); err != nil {
		return fmt.Errorf("keep owner %d:%d: %w", uid, gid, err)
	}
	return nil
}

// owner returns the user and group that own a file, where the platform
// records them. On Unix fi.Sys() is a *syscall.Stat_t; its fields are read
// by name because that type does not exist on every platform, and this
// file builds on all of them.
func owner(fi fs.FileInfo) (uid, gid int, ok bool) {
	v := reflect.ValueOf(fi.Sys())
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return 0, 0, false
	}
	u, g := v.Elem().FieldByName("Uid"), v.Elem().FieldByName("Gid")
	if !u.IsValid() || !g.IsValid() || !u.CanUint() || !g.CanUint() {
		return 0, 0, false
	}
	return int(u.Uint()), int(g.Uint()), true
}
