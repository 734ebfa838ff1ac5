package plugin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/coordino/coordino/plugin/unarygrpc"
	"github.com/coordino/coordino/proto/cni/v1/wire"
)

// Timeouts of one plugin invocation. Kubelet's own CNI deadline is minutes,
// but a runtime must learn quickly that the daemon is away so it can retry.
const (
	// ConnectTimeout bounds how long ADD, CHECK, GC and STATUS wait for the daemon to accept.
	ConnectTimeout = 3 * time.Second
	// CallTimeout bounds one verb once the daemon has accepted it.
	CallTimeout = 2 * time.Minute
)

// Methods of the daemon's CNI service (proto/cni/v1/cni.proto).
const (
	methodAdd    = "/coordino.cni.v1.CNI/Add"
	methodDel    = "/coordino.cni.v1.CNI/Del"
	methodCheck  = "/coordino.cni.v1.CNI/Check"
	methodGC     = "/coordino.cni.v1.CNI/GC"
	methodStatus = "/coordino.cni.v1.CNI/Status"
)

// errUnreachable marks a call that never reached the daemon.
var errUnreachable = errors.New("coordino daemon unreachable")

// call runs one verb and returns the daemon's response message. With retry,
// a daemon that is not (yet) listening is retried with backoff until
// ConnectTimeout; without, the first failure to reach it is returned as
// errUnreachable. A runDir that fails the trust checks is never retried.
func call(conf *Config, method string, req *wire.Request, retry bool) ([]byte, error) {
	body, err := wire.AppendRequest(nil, req)
	if err != nil {
		// The daemon's protobuf runtime would refuse it as malformed.
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables, "invalid CNI invocation: "+err.Error(), "")
	}
	deadline := time.Now().Add(ConnectTimeout)
	delay := 20 * time.Millisecond
	for {
		resp, err := attempt(conf, method, body)
		if err == nil {
			return resp, nil
		}
		var st *unarygrpc.Status
		if !errors.As(err, &st) {
			return nil, err
		}
		if st.Code != unarygrpc.CodeUnavailable {
			return nil, fromStatus(st)
		}
		if !retry || time.Now().Add(delay).After(deadline) {
			return nil, fmt.Errorf("%w at %s: %s", errUnreachable, conf.SocketPath(), st.Message)
		}
		time.Sleep(delay)
		delay = min(delay*2, 400*time.Millisecond)
	}
}

// attempt is one connection and one call. Failing to reach the daemon is an
// Unavailable status, as a gRPC client reports it.
func attempt(conf *Config, method string, body []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
	defer cancel()
	d, err := openRunDir(conf, false)
	if err != nil {
		return nil, unavailableUnlessRefused(err)
	}
	defer d.close()
	deadline, _ := ctx.Deadline()
	conn, err := d.dialSocket(deadline)
	if err != nil {
		return nil, unavailableUnlessRefused(err)
	}
	defer conn.Close()
	return unarygrpc.Call(ctx, conn, method, outgoingMetadata(ctx), body)
}

func unavailableUnlessRefused(err error) error {
	var refused *types.Error
	if errors.As(err, &refused) {
		return refused
	}
	return &unarygrpc.Status{Code: unarygrpc.CodeUnavailable, Message: err.Error()}
}

// fromStatus turns a gRPC status into the CNI error the daemon attached, or
// an internal error when it attached none.
func fromStatus(st *unarygrpc.Status) error {
	if len(st.Details) > 0 {
		if details, err := wire.DecodeStatus(st.Details); err == nil && details.CNIError != nil {
			ce := details.CNIError
			return types.NewError(uint(ce.Code), ce.Msg, ce.Details)
		}
	}
	if st.Code == unarygrpc.CodeDeadlineExceeded {
		return types.NewError(types.ErrTryAgainLater, "coordino daemon did not answer in time: "+st.Message, "")
	}
	return types.NewError(types.ErrInternal, "coordino daemon: "+st.Message, "")
}
