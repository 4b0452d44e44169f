package testkit

import (
	"bytes"
	"os"
	"os/exec"
	"testing"
)

// SmallTmpfs mounts a tmpfs of size (as mount's size= takes it: "2m") on a
// directory of the test's and returns it, for a test of what happens when
// the disk is full; it unmounts it when the test ends. Mounting needs
// root: as another user, or where mount fails, the test is skipped.
func SmallTmpfs(t testing.TB, size string) string {
	t.Helper()
	const why = "needs root to mount a size-limited tmpfs"
	if os.Geteuid() != 0 {
		t.Skip(why)
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("%s: mount: %v: %s", why, err, bytes.TrimSpace(out))
	}
	// Registered after TempDir's own cleanup, so it runs before it; lazy,
	// so a file the code under test still holds open does not keep the
	// mount.
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}
