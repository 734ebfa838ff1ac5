package plugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	cniv1 "github.com/coordino/coordino/proto/cni/v1"
)

// Timeouts of one plugin invocation. Kubelet's own CNI deadline is minutes,
// but a runtime must learn quickly that the daemon is away so it can retry.
const (
	// ConnectTimeout bounds how long ADD, CHECK, GC and STATUS wait for the daemon to accept.
	ConnectTimeout = 3 * time.Second
	// CallTimeout bounds one verb once the daemon has accepted it.
	CallTimeout = 2 * time.Minute
)

// errUnreachable marks a call that never reached the daemon.
var errUnreachable = errors.New("coordino daemon unreachable")

type client struct {
	socket string
	conn   *grpc.ClientConn
	api    cniv1.CNIClient
	// refused is the last trust check that failed while dialing: reported
	// as is instead of as an unreachable daemon.
	refused error
}

func dial(conf *Config) (*client, error) {
	c := &client{socket: conf.SocketPath()}
	conn, err := grpc.NewClient("unix://"+c.socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			d, err := openRunDir(conf, false)
			if err != nil {
				c.noteRefusal(err)
				return nil, err
			}
			defer d.close()
			conn, err := d.dialSocket(ctx)
			c.noteRefusal(err)
			return conn, err
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("create gRPC client for %s: %w", c.socket, err)
	}
	c.conn, c.api = conn, cniv1.NewCNIClient(conn)
	return c, nil
}

func (c *client) noteRefusal(err error) {
	var e *types.Error
	if errors.As(err, &e) {
		c.refused = e
	}
}

func (c *client) close() { _ = c.conn.Close() }

type verbFunc func(context.Context, *cniv1.CNIRequest, ...grpc.CallOption) (*cniv1.CNIResponse, error)

// call runs one verb. With retry, a daemon that is not (yet) listening is
// retried with backoff until ConnectTimeout; without, the first failure to
// reach it is returned as errUnreachable.
func (c *client) call(fn verbFunc, req *cniv1.CNIRequest, retry bool) (*cniv1.CNIResponse, error) {
	deadline := time.Now().Add(ConnectTimeout)
	delay := 20 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
		resp, err := fn(ctx, req)
		cancel()
		if err == nil {
			return resp, nil
		}
		if c.refused != nil {
			return nil, c.refused
		}
		if status.Code(err) != codes.Unavailable {
			return nil, fromStatus(err)
		}
		if !retry || time.Now().Add(delay).After(deadline) {
			return nil, fmt.Errorf("%w at %s: %v", errUnreachable, c.socket, status.Convert(err).Message())
		}
		time.Sleep(delay)
		delay = min(delay*2, 400*time.Millisecond)
	}
}

// fromStatus turns a gRPC error into the CNI error the daemon attached, or an
// internal error when it attached none.
func fromStatus(err error) error {
	st := status.Convert(err)
	for _, d := range st.Details() {
		if ce, ok := d.(*cniv1.CNIError); ok {
			return types.NewError(uint(ce.Code), ce.Msg, ce.Details)
		}
	}
	if st.Code() == codes.DeadlineExceeded {
		return types.NewError(types.ErrTryAgainLater, "coordino daemon did not answer in time: "+st.Message(), "")
	}
	return types.NewError(types.ErrInternal, "coordino daemon: "+st.Message(), "")
}
