package request

import (
	"context"

	"go.uber.org/zap"
)

type loggerKey struct{}

// WithLogger returns ctx carrying log, the logger of one request: the server
// names the verb and the attachment in it once, and every log line the
// request causes, however deep, carries them.
func WithLogger(ctx context.Context, log *zap.Logger) context.Context {
	return context.WithValue(ctx, loggerKey{}, log)
}

// Logger returns the logger WithLogger put in ctx, or fallback when there is none.
func Logger(ctx context.Context, fallback *zap.Logger) *zap.Logger {
	if l, ok := ctx.Value(loggerKey{}).(*zap.Logger); ok {
		return l
	}
	return fallback
}
