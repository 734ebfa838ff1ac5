package endpoint

import (
	"context"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/coordino/coordino/daemon/tracing"
)

// verifyNetns checks that CNI_NETNS is a network namespace other than the
// daemon's own: a pod interface, address and default route put into the
// node's namespace would break the node.
func (m *Manager) verifyNetns(path string) error {
	if err := m.cfg.Network.VerifyPodNetns(path); err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_NETNS: %v", err), "")
	}
	return nil
}

func (m *Manager) pin(ctx context.Context, nsPath, pinPath string) error {
	_, span := tracing.Start(ctx, "netns.pin")
	err := m.cfg.Network.Pin(nsPath, pinPath)
	tracing.End(span, err)
	if err != nil {
		return internalError("pin netns %s: %v", nsPath, err)
	}
	return nil
}

func (m *Manager) unpin(pinPath string) error {
	if err := m.cfg.Network.Unpin(pinPath); err != nil {
		return fmt.Errorf("unpin netns %s: %w", pinPath, err)
	}
	return nil
}
