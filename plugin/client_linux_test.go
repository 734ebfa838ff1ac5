package plugin

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/coordino/coordino/proto/cni/v1/wire"
)

// A daemon that breaks HTTP/2 is unusable like one that is away: ADD
// reports code 11 (try again later) naming the socket and what the server
// did, STATUS code 50, and DEL is queued rather than failed.
func TestProtocolErrorIsAnUnusableDaemon(t *testing.T) {
	root := trustRoot(t)
	run := filepath.Join(root, "run")
	if err := os.Mkdir(run, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(run, wire.SocketName)
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if err := os.Chmod(sock, 0o600); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			// SETTINGS_MAX_FRAME_SIZE 0: below the protocol's minimum.
			c.Write([]byte{0, 0, 6, 0x4, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0})
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	e := invoke(t, "ADD", run)
	if e == nil || e.Code != types.ErrTryAgainLater || !strings.Contains(e.Msg, sock) || !strings.Contains(e.Msg, "SETTINGS_MAX_FRAME_SIZE 0") {
		t.Fatalf("ADD: %v", e)
	}
	if e := invoke(t, "STATUS", run); e == nil || e.Code != types.ErrPluginNotAvailable {
		t.Fatalf("STATUS: %v", e)
	}
	if e := invoke(t, "DEL", run); e != nil {
		t.Fatalf("DEL: %v", e)
	}
	var queued []string
	filepath.WalkDir(filepath.Join(run, wire.DeleteQueueDir), func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".del") {
			queued = append(queued, p)
		}
		return nil
	})
	if len(queued) != 1 {
		t.Fatalf("DEL queued %v, want one entry", queued)
	}
}
