package process

import (
	"context"
	"os/signal"
	"syscall"
)

// SignalContext returns a context that ends on SIGTERM (kubelet stopping
// the pod) or SIGINT; stop releases the signal handlers.
func SignalContext() (ctx context.Context, stop context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
}
