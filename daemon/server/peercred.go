package server

import (
	"context"
	"fmt"
	"net"
	"os"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/credentials"
)

// peerCredentials admits a connection only when the peer process runs as
// root or as the daemon's own user, read from the kernel (SO_PEERCRED), not
// from anything the client says.
type peerCredentials struct {
	allowedUIDs map[uint32]bool
	log         *zap.Logger
}

// PeerCredentials returns gRPC transport credentials admitting only root and
// the daemon's own user; every socket of the daemon uses them. Each refusal
// is logged on log (the client only sees its connection closed).
func PeerCredentials(log *zap.Logger) credentials.TransportCredentials {
	if log == nil {
		log = zap.NewNop()
	}
	return &peerCredentials{allowedUIDs: map[uint32]bool{0: true, uint32(os.Geteuid()): true}, log: log}
}

// PeerAuthInfo carries the verified credentials of a connection.
type PeerAuthInfo struct {
	credentials.CommonAuthInfo
	UID, GID uint32
	PID      int32
}

// AuthType implements credentials.AuthInfo.
func (PeerAuthInfo) AuthType() string { return "unix-peercred" }

func (p *peerCredentials) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return nil, nil, fmt.Errorf("peer credentials: %T is not a Unix socket", conn)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, nil, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, nil, fmt.Errorf("peer credentials: %w", err)
	}
	if credErr != nil {
		return nil, nil, fmt.Errorf("peer credentials: SO_PEERCRED: %w", credErr)
	}
	if !p.allowedUIDs[cred.Uid] {
		p.log.Warn("refused a connection: only root and the daemon's user are served",
			zap.String("socket", conn.LocalAddr().String()), zap.Uint32("uid", cred.Uid), zap.Int32("pid", cred.Pid))
		conn.Close()
		return nil, nil, fmt.Errorf("peer credentials: uid %d (pid %d) is not allowed", cred.Uid, cred.Pid)
	}
	return conn, PeerAuthInfo{
		CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity},
		UID:            cred.Uid, GID: cred.Gid, PID: cred.Pid,
	}, nil
}

func (p *peerCredentials) ClientHandshake(_ context.Context, _ string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return conn, PeerAuthInfo{}, nil
}

func (p *peerCredentials) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "unix-peercred"}
}

func (p *peerCredentials) Clone() credentials.TransportCredentials {
	c := &peerCredentials{allowedUIDs: map[uint32]bool{}, log: p.log}
	for k, v := range p.allowedUIDs {
		c.allowedUIDs[k] = v
	}
	return c
}

func (p *peerCredentials) OverrideServerName(string) error { return nil }
