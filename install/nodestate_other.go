//go:build !linux

package install

import (
	"errors"

	"go.uber.org/zap"
)

// RemoveNodeState is Linux-only: the datapath and pins exist only there.
func RemoveNodeState(NodeState, *zap.Logger) error {
	return errors.New("removing Coordino's node state is supported on Linux only")
}
