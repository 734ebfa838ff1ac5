package request

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	cniv1 "github.com/coordino/coordino/proto/cni/v1"
)

// Decoding prevResult once gives what the CNI library's map round trip
// gives, for results naming their version or not, of any supported version.
func TestPrevResultDecodedAsTheLibraryDoes(t *testing.T) {
	for name, stdin := range map[string]string{
		"1.1.0": `{"cniVersion":"1.1.0","name":"n","type":"coordino","prevResult":{"cniVersion":"1.1.0",` +
			`"interfaces":[{"name":"eth0","mac":"aa:bb:cc:dd:ee:03","sandbox":"/x"}],` +
			`"ips":[{"interface":0,"address":"10.92.0.5/16","gateway":"10.92.0.1"}],"routes":[{"dst":"0.0.0.0/0"}],"dns":{}}}`,
		"0.4.0": `{"cniVersion":"0.4.0","name":"n","type":"coordino","prevResult":{"cniVersion":"0.4.0",` +
			`"ips":[{"version":"4","address":"10.0.0.2/24"}]}}`,
		"no version": `{"cniVersion":"1.0.0","name":"n","type":"coordino","prevResult":{"ips":[{"address":"10.0.0.2/24"}]}}`,
		"null":       `{"cniVersion":"1.0.0","name":"n","type":"coordino","prevResult":null}`,
	} {
		t.Run(name, func(t *testing.T) {
			inv, err := Parse(Add, &cniv1.CNIRequest{Stdin: []byte(stdin), ContainerId: "c1", Ifname: "eth0", Netns: "/x"})
			if err != nil {
				t.Fatal(err)
			}
			var lib types.PluginConf
			if err := json.Unmarshal([]byte(stdin), &lib); err != nil {
				t.Fatal(err)
			}
			if err := version.ParsePrevResult(&lib); err != nil {
				t.Fatal(err)
			}
			var want *current.Result
			if lib.PrevResult != nil {
				if want, err = current.NewResultFromResult(lib.PrevResult); err != nil {
					t.Fatal(err)
				}
			}
			if !reflect.DeepEqual(inv.PrevResult, want) {
				t.Fatalf("prevResult %+v, the library gives %+v", inv.PrevResult, want)
			}
		})
	}
}
