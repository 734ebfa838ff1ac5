package plugin

import (
	"errors"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig([]byte(`{"cniVersion":"1.1.0","name":"n","type":"coordino"}`))
	if err != nil || c.SocketPath() != "/run/coordino/coordino.sock" || c.QueueDir() != "/run/coordino/delete-queue" {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	for in, code := range map[string]uint{
		`{`:                                 types.ErrDecodingFailure,
		`{"runDir":"x/y"}`:                  types.ErrInvalidNetworkConfig,
		`{"runDir":12}`:                     types.ErrDecodingFailure,
		`{"runDir":"/run/x/../coordino/a"}`: 0,
		`{"runDir":"/a/../b"}`:              types.ErrInvalidNetworkConfig,
	} {
		_, err := ParseConfig([]byte(in))
		var e *types.Error
		if code == 0 {
			if err != nil {
				t.Errorf("%s: %v", in, err)
			}
			continue
		}
		if !errors.As(err, &e) || e.Code != code {
			t.Errorf("%s: err = %v, want code %d", in, err, code)
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"cniVersion":"1.1.0","name":"n","type":"coordino","runDir":"/run/x"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			var e *types.Error
			if !errors.As(err, &e) {
				t.Fatalf("non-CNI error %v", err)
			}
			return
		}
		if c.RunDir == "" || c.RunDir[0] != '/' {
			t.Fatalf("accepted runDir %q", c.RunDir)
		}
	})
}
