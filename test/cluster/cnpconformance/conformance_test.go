package cnpconformance

import (
	"embed"
	"os"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	api "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/network-policy-api/conformance/tests"
	"sigs.k8s.io/network-policy-api/conformance/utils/flags"
	"sigs.k8s.io/network-policy-api/conformance/utils/suite"
)

// manifests is ./base as go run ./gen wrote it.
//
//go:embed base
var manifests embed.FS

// TestConformance runs the module's conformance tests as its own
// TestConformance does, with the base manifests of ./base and the tests
// named in CNP_SKIP_TESTS (comma-separated short names) skipped.
func TestConformance(t *testing.T) {
	cfg, err := config.GetConfig()
	if err != nil {
		t.Fatalf("kubeconfig: %v", err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("clientset: %v", err)
	}
	if err := api.Install(c.Scheme()); err != nil {
		t.Fatalf("scheme: %v", err)
	}
	var skip []string
	if s := os.Getenv("CNP_SKIP_TESTS"); s != "" {
		skip = strings.Split(s, ",")
	}
	cSuite := suite.New(suite.Options{
		Client: c, ClientSet: cs, KubeConfig: *cfg, Debug: *flags.ShowDebug,
		CleanupBaseResources: *flags.CleanupBaseResources,
		SupportedFeatures:    suite.ParseSupportedFeatures(*flags.SupportedFeatures),
		ExemptFeatures:       suite.ParseSupportedFeatures(*flags.ExemptFeatures),
		SkipTests:            skip,
		FS:                   &manifests,
	})
	cSuite.Setup(t)
	cSuite.Run(t, tests.ConformanceTests)
}
