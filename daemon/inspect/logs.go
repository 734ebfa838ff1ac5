package inspect

import (
	"bytes"
	"sync"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// logRingBytes bounds the daemon's own log lines kept for bug reports.
const logRingBytes = 1 << 20

// LogRing keeps the daemon's newest log lines (JSON, as on stderr) in
// memory, so a bug report has logs even where stderr went nowhere
// retrievable.
type LogRing struct {
	mu    sync.Mutex
	lines [][]byte
	size  int
}

// RecordLogs returns log teed into a new LogRing at log's level.
func RecordLogs(log *zap.Logger) (*zap.Logger, *LogRing) {
	r := &LogRing{}
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	core := zapcore.NewCore(enc, zapcore.AddSync(r), log.Level())
	return log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return zapcore.NewTee(c, core) })), r
}

// Write takes one encoded line (zap writes each entry in one call).
func (r *LogRing) Write(p []byte) (int, error) {
	line := bytes.Clone(p)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, line)
	r.size += len(line)
	for r.size > logRingBytes && len(r.lines) > 1 {
		r.size -= len(r.lines[0])
		r.lines = r.lines[1:]
	}
	return len(p), nil
}

// Bytes returns the kept lines, oldest first.
func (r *LogRing) Bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Join(r.lines, nil)
}
