//go:build !linux

package install

import (
	"errors"
	"log/slog"
)

// RemoveNodeState is Linux-only: the datapath and pins exist only there.
func RemoveNodeState(NodeState, *slog.Logger) error {
	return errors.New("removing Coordino's node state is supported on Linux only")
}
