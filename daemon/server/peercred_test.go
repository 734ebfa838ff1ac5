package server

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/coordino/coordino/daemon/endpoint"
	"github.com/coordino/coordino/daemon/ipam"
	"github.com/coordino/coordino/daemon/metrics"
	"github.com/coordino/coordino/daemon/store"
	cniv1 "github.com/coordino/coordino/proto/cni/v1"
	"github.com/coordino/coordino/test/privileged"
)

const clientEnv = "COORDINO_TEST_PEERCRED_SOCKET"

// TestMain doubles as the unprivileged client: re-executed with clientEnv
// set, the test binary calls STATUS on that socket and reports the outcome.
func TestMain(m *testing.M) {
	if sock := os.Getenv(clientEnv); sock != "" {
		if err := callStatus(sock); err != nil {
			fmt.Println("REFUSED:", err)
			os.Exit(3)
		}
		fmt.Println("SERVED")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func callStatus(sock string) error {
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = cniv1.NewCNIClient(conn).Status(ctx, &cniv1.CNIRequest{Stdin: []byte(`{"cniVersion":"1.1.0","name":"n","type":"coordino"}`)})
	return err
}

func TestPeerCredentialsRefuseOtherUsers(t *testing.T) {
	privileged.Require(t)
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	pool, _ := ipam.NewPool(nil)
	mgr := endpoint.New(endpoint.Config{Pool: pool, Store: st})
	core, logs := observer.New(zap.InfoLevel)
	g := New(mgr, metrics.New(pool, func() (map[string]int, error) { return nil, nil }), zap.New(core)).GRPCServer()

	// Deliberately world-connectable, so only the credential check stands in
	// the way (t.TempDir's parent is 0700: the client would not reach the socket).
	sockDir, err := os.MkdirTemp("", "coordino-peercred-sock-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	if err := os.Chmod(sockDir, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(sockDir, "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(sock, 0o777)
	go g.Serve(l)
	defer g.Stop()

	// A copy of the test binary that the unprivileged user may execute.
	binDir, err := os.MkdirTemp("", "coordino-peercred-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(binDir)
	os.Chmod(binDir, 0o755)
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	client := filepath.Join(binDir, "client")
	if err := os.WriteFile(client, self, 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(cred *syscall.Credential) (string, error) {
		cmd := exec.Command(client, "-test.run=^$")
		cmd.Env = append(os.Environ(), clientEnv+"="+sock)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run(nil); err != nil || !strings.Contains(out, "SERVED") {
		t.Fatalf("root client: %v %s", err, out)
	}
	out, err := run(&syscall.Credential{Uid: 65534, Gid: 65534})
	if err == nil || !strings.Contains(out, "REFUSED") {
		t.Fatalf("uid 65534 client was served: %v %s", err, out)
	}
	// The refusal is the daemon's to explain: the client sees a closed connection.
	refused := logs.FilterMessageSnippet("refused a connection").AllUntimed()
	if len(refused) == 0 || refused[0].ContextMap()["uid"] != uint32(65534) {
		t.Fatalf("refusal not logged: %v (client: %s)", logs.AllUntimed(), out)
	}
}
