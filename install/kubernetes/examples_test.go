package kubernetes

import (
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

// TestExamplePools: every example decodes strictly as an IPPool the
// controller accepts; together they cover IPv4, IPv6 and dual-stack.
func TestExamplePools(t *testing.T) {
	var sawV4, sawV6, sawDual bool
	for f, p := range examplePools(t) {
		if p.Kind != "IPPool" || p.APIVersion != "coordino.io/v1alpha1" || p.Name == "" {
			t.Errorf("%s: %s %s %q", f, p.APIVersion, p.Kind, p.Name)
		}
		prefixes, err := p.Spec.Prefixes()
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var v4, v6 bool
		for _, q := range prefixes {
			v4, v6 = v4 || q.Addr().Is4(), v6 || q.Addr().Is6()
		}
		sawV4, sawV6, sawDual = sawV4 || v4 && !v6, sawV6 || v6 && !v4, sawDual || v4 && v6
	}
	if !sawV4 || !sawV6 || !sawDual {
		t.Errorf("examples cover IPv4 %v, IPv6 %v, dual-stack %v", sawV4, sawV6, sawDual)
	}
}

// examplePools decodes examples/ippool-*.yaml strictly, by file name.
func examplePools(t *testing.T) map[string]*coordinov1alpha1.IPPool {
	t.Helper()
	files, err := filepath.Glob("examples/ippool-*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples: %v", err)
	}
	out := map[string]*coordinov1alpha1.IPPool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		p := &coordinov1alpha1.IPPool{}
		if err := yaml.UnmarshalStrict(b, p); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[f] = p
	}
	return out
}
