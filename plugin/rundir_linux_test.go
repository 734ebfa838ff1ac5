package plugin

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/coordino/coordino/proto/cni/v1/wire"
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

// invoke runs verb as the runtime would, through the plugin's dispatcher.
func invoke(t *testing.T, verb, runDir string) *types.Error {
	t.Helper()
	env := map[string]string{"CNI_COMMAND": verb, "CNI_CONTAINERID": "c1", "CNI_NETNS": "/proc/self/ns/net", "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin"}
	stdin := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"n","type":"coordino","runDir":%q}`, runDir)
	return dispatch(func(k string) string { return env[k] }, strings.NewReader(stdin), io.Discard, io.Discard)
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
	wantRunDirError(t, invoke(t, "DEL", filepath.Join(root, "link", "run")), "symlink")
	if left, _ := os.ReadDir(target); len(left) != 0 {
		t.Fatalf("DEL followed the symlink and wrote %v", left)
	}
}

func TestDelRefusesForeignQueueDir(t *testing.T) {
	root := trustRoot(t)
	run := filepath.Join(root, "run")
	queue := filepath.Join(run, wire.DeleteQueueDir)
	if err := os.MkdirAll(queue, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(queue, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	wantRunDirError(t, invoke(t, "DEL", run), "not root")
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
	wantRunDirError(t, invoke(t, "DEL", run), "writable")
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
			sock := filepath.Join(run, wire.SocketName)
			connected := listen(t, sock)
			if err := os.Chmod(sock, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := fix(sock); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			wantRunDirError(t, invoke(t, "ADD", run), "owned by root with mode 0600")
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

// listenerHelperEnv makes the test binary a listener on the given socket:
// TestAddRefusesListenerNotRoot starts it as another user.
const listenerHelperEnv = "COORDINO_TEST_LISTEN_ON"

func TestMain(m *testing.M) {
	if sock := os.Getenv(listenerHelperEnv); sock != "" {
		l, err := net.Listen("unix", sock)
		if err != nil {
			os.Exit(3)
		}
		os.Stdout.WriteString("listening\n")
		for {
			c, err := l.Accept()
			if err != nil {
				os.Exit(0)
			}
			c.Close()
		}
	}
	os.Exit(m.Run())
}

func TestAddRefusesListenerNotRoot(t *testing.T) {
	root := trustRoot(t)
	run := filepath.Join(root, "run")
	if err := os.Mkdir(run, 0o700); err != nil {
		t.Fatal(err)
	}
	// The other user's process must be able to create its socket in run.
	sockDir := filepath.Join(root, "helper")
	if err := os.Mkdir(sockDir, 0o777); err != nil || os.Chmod(sockDir, 0o777) != nil || os.Chmod(root, 0o755) != nil || os.Chmod(filepath.Dir(root), 0o755) != nil {
		t.Fatal(err)
	}
	helperSock := filepath.Join(sockDir, "s.sock")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The test binary lives in a root-only temp dir: copy it where uid 65534 can run it.
	exe := filepath.Join(sockDir, "helper.test")
	data, err := os.ReadFile(self)
	if err != nil || os.WriteFile(exe, data, 0o755) != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = []string{listenerHelperEnv + "=" + helperSock}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "listening\n" {
		t.Fatalf("helper: %q %v", line, err)
	}
	// The socket file passes the ownership checks; only its listener is not root.
	sock := filepath.Join(run, wire.SocketName)
	if err := os.Rename(helperSock, sock); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(sock, 0, 0); err != nil || os.Chmod(sock, 0o600) != nil {
		t.Fatal(err)
	}
	wantRunDirError(t, invoke(t, "ADD", run), "uid 65534, not root")
}
