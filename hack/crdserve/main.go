// Command crdserve adds a served version to generated CRD manifests: for
// each file named, a copy of its storage version under the new name, with
// the same schema, subresources and columns, served and not stored; with
// -storage the copy becomes the storage version and the original stays
// served (the controller then rewrites the objects stored in it).
// Identical schemas need no conversion webhook: the API server only
// rewrites apiVersion. hack/generate-api.sh runs it after controller-gen
// for the kinds that have graduated.
//
//	go run ./hack/crdserve -version v1beta1 [-storage] api/crds/coordino.io_ippools.yaml ...
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"

	"sigs.k8s.io/yaml"
)

func main() {
	version := flag.String("version", "", "the version to serve beside the storage version, e.g. v1beta1")
	storage := flag.Bool("storage", false, "make the new version the storage version")
	flag.Parse()
	if *version == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: crdserve -version VERSION [-storage] CRD.yaml...")
		os.Exit(2)
	}
	for _, path := range flag.Args() {
		if err := serve(path, *version, *storage); err != nil {
			fmt.Fprintf(os.Stderr, "crdserve: %s: %v\n", path, err)
			os.Exit(1)
		}
	}
}

func serve(path, version string, storage bool) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var crd map[string]any
	if err := yaml.Unmarshal(data, &crd); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	spec, _ := crd["spec"].(map[string]any)
	versions, _ := spec["versions"].([]any)
	var stored map[string]any
	for _, v := range versions {
		v, _ := v.(map[string]any)
		if v["name"] == version {
			return fmt.Errorf("spec.versions already has %s", version)
		}
		if v["storage"] == true {
			stored = v
		}
	}
	if stored == nil {
		return errors.New("spec.versions has no storage version")
	}
	// A deep copy through JSON, so the two entries share nothing.
	raw, err := json.Marshal(stored)
	if err != nil {
		return err
	}
	var served map[string]any
	if err := json.Unmarshal(raw, &served); err != nil {
		return err
	}
	served["name"], served["served"], served["storage"] = version, true, storage
	if storage {
		stored["storage"] = false
	}
	spec["versions"] = append(versions, served)
	out, err := yaml.Marshal(crd)
	if err != nil {
		return err
	}
	return os.WriteFile(path, append([]byte("---\n"), bytes.TrimPrefix(out, []byte("---\n"))...), 0o644)
}
