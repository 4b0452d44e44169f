package natscluster

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
)

// ToolsEnv names the environment variable that points at a directory
// holding nats-server and natsstream already built; the binaries there are
// taken as they are. Without it the kit uses ToolsDir under the
// repository, building the binaries there when they are missing or older
// than their module.
const ToolsEnv = "FIELDGATE_TESTTOOLS"

// ToolsDir is where `make test` (its tools step) and the kit build the
// binaries, relative to the repository's root.
const ToolsDir = "bin/testtools"

// toolsModule is the module that builds them, relative to the root: its
// own go.mod keeps the NATS server out of the firmware's.
const toolsModule = "scripts/testtools"

// buildWait bounds the build of the binaries, before the time scale: a
// cold build of the NATS server takes about two minutes on a loaded
// 2-core machine.
const buildWait = 10 * time.Minute

// Tool names: the upstream server's main package, and our reader.
const (
	serverTool = "nats-server"
	streamTool = "natsstream"
)

var (
	toolsOnce sync.Once
	toolsPath string
	toolsErr  error
)

// tool returns the path of the named binary, building the tools first if
// needed; the test fails when they cannot be had.
func tool(t testing.TB, name string) string {
	t.Helper()
	toolsOnce.Do(func() { toolsPath, toolsErr = findTools() })
	if toolsErr != nil {
		t.Fatalf("natscluster: %v", toolsErr)
	}
	p := filepath.Join(toolsPath, name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("natscluster: %v", err)
	}
	return p
}

// findTools returns the directory of up-to-date binaries, building them
// into ToolsDir when they are missing or stale.
func findTools() (string, error) {
	if dir := os.Getenv(ToolsEnv); dir != "" {
		for _, name := range []string{serverTool, streamTool} {
			if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
				return "", fmt.Errorf("%s=%s: %w", ToolsEnv, dir, err)
			}
		}
		return dir, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, ToolsDir)
	stale, err := staleTools(filepath.Join(root, toolsModule), dir)
	if err != nil {
		return "", err
	}
	if stale {
		if err := buildTools(filepath.Join(root, toolsModule), dir); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// repoRoot walks up from the working directory (a test's package
// directory) to the directory that holds the tools module.
func repoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, toolsModule, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no %s/go.mod above %s: run the tests inside the fieldgate repository, or set %s", toolsModule, wd, ToolsEnv)
		}
	}
}

// staleTools reports whether a binary in dir is missing or older than a
// file of the tools module: go.mod, go.sum or a source file.
func staleTools(module, dir string) (bool, error) {
	oldest := time.Time{}
	for i, name := range []string{serverTool, streamTool} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return true, nil
		}
		if i == 0 || st.ModTime().Before(oldest) {
			oldest = st.ModTime()
		}
	}
	stale := false
	err := filepath.WalkDir(module, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if ext := filepath.Ext(p); ext != ".go" && ext != ".mod" && ext != ".sum" {
			return nil
		}
		info, err := d.Info()
		if err == nil && info.ModTime().After(oldest) {
			stale = true
		}
		return err
	})
	return stale, err
}

// buildTools builds both binaries into a fresh directory beside dir and
// moves them into place, so that a concurrent test never runs half a
// binary.
func buildTools(module, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".testtools-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Scale(buildWait))
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", tmp+string(filepath.Separator),
		"github.com/nats-io/nats-server/v2", "./"+streamTool)
	cmd.Dir = module
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building the test tools in %s (go build): %v\n%s", module, err, out)
	}
	for _, name := range []string{serverTool, streamTool} {
		if err := os.Rename(filepath.Join(tmp, name), filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return nil
}
