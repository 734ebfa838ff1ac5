package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordino/coordino/daemon/endpoint"
	"github.com/coordino/coordino/daemon/metrics"
	"github.com/coordino/coordino/daemon/request"
	"github.com/coordino/coordino/daemon/tracing"
	cniv1 "github.com/coordino/coordino/proto/cni/v1"
)

// Server implements the CNI gRPC service.
type Server struct {
	cniv1.UnimplementedCNIServer
	mgr     *endpoint.Manager
	metrics *metrics.Metrics
	log     *zap.Logger
}

// New returns a Server over mgr.
func New(mgr *endpoint.Manager, m *metrics.Metrics, log *zap.Logger) *Server {
	return &Server{mgr: mgr, metrics: m, log: log}
}

// Listen creates the socket: a 0700 directory, a 0600 socket, any stale
// socket from a previous run replaced.
func Listen(socketPath string) (net.Listener, error) {
	dir := filepath.Dir(socketPath)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create socket dir %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("restrict socket dir %s: %w", dir, err)
	}
	// Bound under a temporary name and renamed into place once 0600: the
	// plugin refuses a socket with any other mode, and a bind creates it
	// with the umask's.
	tmp := socketPath + ".new"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket %s: %w", tmp, err)
	}
	l, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", socketPath, err)
	}
	ul := l.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		l.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("restrict socket %s: %w", socketPath, err)
	}
	if err := os.Rename(tmp, socketPath); err != nil {
		l.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("place socket %s: %w", socketPath, err)
	}
	return &socketListener{UnixListener: ul, path: socketPath}, nil
}

// socketListener removes its socket when closed, as a listener that bound
// the path itself would.
type socketListener struct {
	*net.UnixListener
	path string
}

func (l *socketListener) Close() error {
	err := l.UnixListener.Close()
	if rerr := os.Remove(l.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) && err == nil {
		err = rerr
	}
	return err
}

// GRPCServer returns a gRPC server with s registered, admitting root and the
// daemon's own user only.
func (s *Server) GRPCServer() *grpc.Server {
	g := grpc.NewServer(grpc.Creds(PeerCredentials(s.log)))
	cniv1.RegisterCNIServer(g, s)
	return g
}

// Add implements the ADD verb.
func (s *Server) Add(ctx context.Context, req *cniv1.CNIRequest) (*cniv1.CNIResponse, error) {
	return s.serve(ctx, request.Add, req, s.mgr.Add)
}

// Del implements the DEL verb.
func (s *Server) Del(ctx context.Context, req *cniv1.CNIRequest) (*cniv1.CNIResponse, error) {
	return s.serve(ctx, request.Del, req, noResult(s.mgr.Del))
}

// Check implements the CHECK verb.
func (s *Server) Check(ctx context.Context, req *cniv1.CNIRequest) (*cniv1.CNIResponse, error) {
	return s.serve(ctx, request.Check, req, noResult(s.mgr.Check))
}

// GC implements the GC verb.
func (s *Server) GC(ctx context.Context, req *cniv1.CNIRequest) (*cniv1.CNIResponse, error) {
	return s.serve(ctx, request.GC, req, noResult(func(ctx context.Context, inv *request.Invocation) error {
		return s.mgr.GC(ctx, inv, inv.Conf.ValidAttachments)
	}))
}

// Status implements the STATUS verb.
func (s *Server) Status(ctx context.Context, req *cniv1.CNIRequest) (*cniv1.CNIResponse, error) {
	return s.serve(ctx, request.Status, req, noResult(func(ctx context.Context, _ *request.Invocation) error { return s.mgr.Status(ctx) }))
}

// verbFunc carries out one verb; ctx holds the request's deadline, trace and logger.
type verbFunc func(ctx context.Context, inv *request.Invocation) ([]byte, error)

func noResult(f func(context.Context, *request.Invocation) error) verbFunc {
	return func(ctx context.Context, inv *request.Invocation) ([]byte, error) { return nil, f(ctx, inv) }
}

func (s *Server) serve(ctx context.Context, verb request.Verb, req *cniv1.CNIRequest, do verbFunc) (*cniv1.CNIResponse, error) {
	start := time.Now()
	ctx, span := tracing.StartServer(ctx, "cni."+string(verb))
	defer span.End()
	if span.IsRecording() {
		span.SetAttributes(tracing.VerbKey.String(string(verb)), tracing.ContainerIDKey.String(req.ContainerId), tracing.IfNameKey.String(req.Ifname))
	}
	result, err := func() ([]byte, error) {
		_, pspan := tracing.Start(ctx, "request.parse")
		inv, err := request.Parse(verb, req)
		tracing.End(pspan, err)
		if err != nil {
			return nil, err
		}
		if span.IsRecording() {
			span.SetAttributes(tracing.NetworkKey.String(inv.Key.Network), tracing.PodKey.String(inv.PodName), tracing.NamespaceKey.String(inv.PodNamespace))
		}
		// Lazy: most requests log nothing, and they then pay nothing for it.
		log := s.log.WithLazy(zap.String("verb", string(verb)), zap.String("containerID", req.ContainerId), zap.String("ifname", req.Ifname))
		return do(request.WithLogger(ctx, log), inv)
	}()
	elapsed := time.Since(start)
	cniErr := asCNIError(err)
	var code uint
	if cniErr != nil {
		code = cniErr.Code
		s.log.Warn("CNI request failed", zap.String("verb", string(verb)), zap.String("containerID", req.ContainerId), zap.String("ifname", req.Ifname),
			zap.Uint("code", code), zap.String("msg", cniErr.Msg), zap.Duration("took", elapsed))
	} else if ce := s.log.Check(zap.DebugLevel, "CNI request done"); ce != nil {
		// Checked first: at info level a successful request encodes no fields.
		ce.Write(zap.String("verb", string(verb)), zap.String("containerID", req.ContainerId), zap.String("ifname", req.Ifname), zap.Duration("took", elapsed))
	}
	s.metrics.ObserveRequest(string(verb), elapsed, code)
	if span.IsRecording() {
		span.SetAttributes(tracing.CodeKey.Int(int(code)))
		if cniErr != nil {
			span.SetStatus(otelcodes.Error, cniErr.Msg)
		}
	}
	if cniErr != nil {
		return nil, toStatus(cniErr)
	}
	return &cniv1.CNIResponse{Result: result}, nil
}

func asCNIError(err error) *types.Error {
	if err == nil {
		return nil
	}
	var e *types.Error
	if errors.As(err, &e) {
		return e
	}
	return types.NewError(types.ErrInternal, err.Error(), "")
}

// toStatus carries a CNI error to the plugin. FailedPrecondition, never
// Unavailable: the plugin retries Unavailable as "daemon not reachable".
func toStatus(e *types.Error) error {
	st := status.New(codes.FailedPrecondition, e.Msg)
	if withDetails, err := st.WithDetails(&cniv1.CNIError{Code: uint32(e.Code), Msg: e.Msg, Details: e.Details}); err == nil {
		st = withDetails
	}
	return st.Err()
}
