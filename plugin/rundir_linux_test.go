package plugin

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/coordino/coordino/test/privileged"
)

// trustRoot makes a fresh temp dir the only extra trusted root and returns it.
func trustRoot(t *testing.T) string {
	t.Helper()
	privileged.Require(t) // chown to another user needs root
	root := t.TempDir()
	t.Setenv(RunDirRootsEnv, root)
	return root
}

func invoke(t *testing.T, verb func(*skel.CmdArgs) error, runDir string) *types.Error {
	t.Helper()
	err := verb(&skel.CmdArgs{
		ContainerID: "c1", Netns: "/proc/self/ns/net", IfName: "eth0",
		StdinData: fmt.Appendf(nil, `{"cniVersion":"1.1.0","name":"n","type":"coordino","runDir":%q}`, runDir),
	})
	if err == nil {
		return nil
	}
	var e *types.Error
	if !errors.As(err, &e) {
		t.Fatalf("non-CNI error %v", err)
	}
	return e
}

func wantRunDirError(t *testing.T, e *types.Error, fragment string) {
	t.Helper()
	if e == nil || e.Code != types.ErrInvalidNetworkConfig || !strings.Contains(e.Msg, "runDir") || !strings.Contains(e.Msg, fragment) {
		t.Fatalf("got %v, want code 7 naming runDir and %q", e, fragment)
	}
}

// listen serves a socket that records whether anyone connected.
func listen(t *testing.T, path string) (connected func() bool) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	got := make(chan struct{}, 1)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
			select {
			case got <- struct{}{}:
			default:
			}
		}
	}()
	return func() bool {
		select {
		case <-got:
			return true
		case <-time.After(50 * time.Millisecond):
			return false
		}
	}
}

func TestDelRefusesSymlinkInRunDir(t *testing.T) {
	root := trustRoot(t)
	target := filepath.Join(root, "elsewhere")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	wantRunDirError(t, invoke(t, cmdDel, filepath.Join(root, "link", "run")), "symlink")
	if left, _ := os.ReadDir(target); len(left) != 0 {
		t.Fatalf("DEL followed the symlink and wrote %v", left)
	}
}

func TestDelRefusesForeignQueueDir(t *testing.T) {
	root := trustRoot(t)
	run := filepath.Join(root, "run")
	queue := filepath.Join(run, DeleteQueueDir)
	if err := os.MkdirAll(queue, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(queue, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	wantRunDirError(t, invoke(t, cmdDel, run), "not root")
	if left, _ := os.ReadDir(queue); len(left) != 0 {
		t.Fatalf("DEL wrote into a queue dir owned by another user: %v", left)
	}
}

func TestRefusesRunDirWritableByOthers(t *testing.T) {
	root := trustRoot(t)
	run := filepath.Join(root, "run")
	if err := os.Mkdir(run, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(run, 0o777); err != nil {
		t.Fatal(err)
	}
	wantRunDirError(t, invoke(t, cmdDel, run), "writable")
	if left, _ := os.ReadDir(run); len(left) != 0 {
		t.Fatalf("DEL wrote into a world-writable runDir: %v", left)
	}
}

func TestAddRefusesSocketNotRootOnly(t *testing.T) {
	for name, fix := range map[string]func(string) error{
		"foreign owner":  func(p string) error { return os.Chown(p, 65534, 65534) },
		"world writable": func(p string) error { return os.Chmod(p, 0o666) },
		"group readable": func(p string) error { return os.Chmod(p, 0o640) },
	} {
		t.Run(name, func(t *testing.T) {
			root := trustRoot(t)
			run := filepath.Join(root, "run")
			if err := os.Mkdir(run, 0o700); err != nil {
				t.Fatal(err)
			}
			sock := filepath.Join(run, SocketName)
			connected := listen(t, sock)
			if err := os.Chmod(sock, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := fix(sock); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			wantRunDirError(t, invoke(t, cmdAdd, run), "owned by root with mode 0600")
			if connected() {
				t.Fatal("ADD dialed a socket it should not trust")
			}
			if took := time.Since(start); took > ConnectTimeout {
				t.Fatalf("refusal took %v: retried like an unreachable daemon", took)
			}
		})
	}
}

func TestRunDirOutsideTrustedRoots(t *testing.T) {
	t.Setenv(RunDirRootsEnv, "")
	for _, dir := range []string{"/etc", "/var/lib/kubelet/pods/x", "/run/coordinox", "/run"} {
		_, err := ParseConfig(fmt.Appendf(nil, `{"runDir":%q}`, dir))
		var e *types.Error
		if !errors.As(err, &e) || e.Code != types.ErrInvalidNetworkConfig || !strings.Contains(e.Msg, "runDir") || !strings.Contains(e.Msg, RunDirRootsEnv) {
			t.Errorf("runDir %s: err = %v, want code 7 naming runDir and %s", dir, err, RunDirRootsEnv)
		}
	}
}
