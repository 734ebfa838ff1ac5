package process

import (
	"fmt"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// LevelUsage is the help text of a --log-level flag.
const LevelUsage = "debug, info, warn or error"

// ParseLevel reads a --log-level value.
func ParseLevel(s string) (zapcore.Level, error) {
	switch s {
	case "debug", "info", "warn", "error":
		return zapcore.ParseLevel(s)
	}
	return 0, fmt.Errorf("log-level %q: want %s", s, LevelUsage)
}

// NewLogger returns the JSON logger on stderr at level. It is not sampled:
// a message repeated under load is the one an operator looks for.
func NewLogger(level string) (*zap.Logger, error) {
	lvl, err := ParseLevel(level)
	if err != nil {
		return nil, err
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.Sampling = nil
	return cfg.Build()
}
