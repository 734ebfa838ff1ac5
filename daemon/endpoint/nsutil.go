package endpoint

import (
	"fmt"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/coordino/coordino/daemon/netns"
)

// verifyNetns checks that CNI_NETNS is a network namespace other than the
// daemon's own: a pod interface, address and default route put into the
// node's namespace would break the node.
func verifyNetns(path string) error {
	err := netns.Verify(path)
	if err == nil {
		err = netns.RefuseOwn(path)
	}
	if err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_NETNS: %v", err), "")
	}
	return nil
}

func pin(nsPath, pinPath string) error {
	if err := netns.Pin(nsPath, pinPath); err != nil {
		return internalError("pin netns %s: %v", nsPath, err)
	}
	return nil
}

func unpin(pinPath string) error {
	if err := netns.Unpin(pinPath); err != nil {
		return fmt.Errorf("unpin netns %s: %w", pinPath, err)
	}
	return nil
}
