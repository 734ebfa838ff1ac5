package k8smode

import (
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/coordino/coordino/test/apiserver"
)

// apiProxy reaches the API server from inside a node netns.
type apiProxy = apiserver.NetnsProxy

func newAPIProxy(t testing.TB, nodeNS ns.NetNS, target string) *apiProxy {
	return apiserver.NewNetnsProxy(t, nodeNS, target)
}
