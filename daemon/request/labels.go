package request

import (
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
)

// parseLabels validates args.cni.labels as Kubernetes validates pod labels:
// keys are qualified names ([prefix/]name), values are empty or up to 63
// characters of [A-Za-z0-9._-] starting and ending alphanumeric, and no key
// appears twice. Labels select policy, so anything looser would let two
// different label sets ("a=b":"c" and "a":"b=c") read as one.
func parseLabels(conf *NetConf) (map[string]string, error) {
	if conf.Args == nil || conf.Args.CNI == nil || len(conf.Args.CNI.Labels) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(conf.Args.CNI.Labels))
	for i, l := range conf.Args.CNI.Labels {
		if errs := validation.IsQualifiedName(l.Key); len(errs) > 0 {
			return nil, labelError("args.cni.labels[%d].key %q: %s", i, l.Key, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(l.Value); len(errs) > 0 {
			return nil, labelError("args.cni.labels[%d].value %q (key %q): %s", i, l.Value, l.Key, strings.Join(errs, "; "))
		}
		if _, dup := out[l.Key]; dup {
			return nil, labelError("args.cni.labels[%d].key %q appears more than once", i, l.Key)
		}
		out[l.Key] = l.Value
	}
	return out, nil
}

func labelError(format string, args ...any) error {
	return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf(format, args...), "")
}
