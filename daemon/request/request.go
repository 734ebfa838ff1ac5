package request

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/utils"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/coordino/coordino/daemon/store"
	cniv1 "github.com/coordino/coordino/proto/cni/v1"
)

// Verb is a CNI command.
type Verb string

// The CNI verbs the daemon serves.
const (
	Add    Verb = "ADD"
	Del    Verb = "DEL"
	Check  Verb = "CHECK"
	GC     Verb = "GC"
	Status Verb = "STATUS"
)

// PluginType is the CNI type Coordino's config must carry.
const PluginType = "coordino"

// NetConf is Coordino's plugin configuration.
type NetConf struct {
	types.PluginConf
	// PrevResultJSON takes prevResult in place of PluginConf's map, so it is
	// decoded once, straight into its result type (parsePrevResult).
	PrevResultJSON json.RawMessage `json:"prevResult,omitempty"`

	RunDir   string `json:"runDir,omitempty"`
	MTU      int    `json:"mtu,omitempty"`
	LogLevel string `json:"logLevel,omitempty"`
	// Args carries the "args.cni.labels" convention for pod labels in standalone mode.
	Args *struct {
		CNI *struct {
			Labels []struct {
				Key   string `json:"key"`
				Value string `json:"value"`
			} `json:"labels"`
		} `json:"cni"`
	} `json:"args,omitempty"`
}

// Invocation is a validated CNI call.
type Invocation struct {
	Verb  Verb
	Key   store.Key
	Netns string
	Conf  *NetConf
	// PrevResult is the prevResult converted to the current result version, or nil.
	PrevResult   *current.Result
	PodNamespace string
	PodName      string
	PodUID       string
	Labels       map[string]string
}

// Parse validates req for verb.
func Parse(verb Verb, req *cniv1.CNIRequest) (*Invocation, error) {
	conf, err := ParseConf(req.Stdin)
	if err != nil {
		return nil, err
	}
	inv := &Invocation{Verb: verb, Conf: conf, Netns: req.Netns}
	if verb == GC || verb == Status {
		inv.Key.Network = conf.Name
		return inv, nil
	}
	if e := utils.ValidateContainerID(req.ContainerId); e != nil {
		return nil, e
	}
	if e := utils.ValidateInterfaceName(req.Ifname); e != nil {
		return nil, e
	}
	inv.Key = store.Key{Network: conf.Name, ContainerID: req.ContainerId, IfName: req.Ifname}
	if (verb == Add || verb == Check) && req.Netns == "" {
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_NETNS is required for "+string(verb), "")
	}
	args, err := ParseArgs(req.Args)
	if err != nil {
		return nil, err
	}
	inv.PodNamespace = args["K8S_POD_NAMESPACE"]
	if inv.PodNamespace == "" {
		inv.PodNamespace = "default"
	}
	inv.PodName, inv.PodUID = args["K8S_POD_NAME"], args["K8S_POD_UID"]
	// DEL needs no labels: a config with bad ones must still tear down.
	if verb != Del {
		if inv.Labels, err = parseLabels(conf); err != nil {
			return nil, err
		}
	}
	if conf.PrevResult != nil {
		prev, err := current.NewResultFromResult(conf.PrevResult)
		if err != nil {
			return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("convert prevResult: %v", err), "")
		}
		inv.PrevResult = prev
	}
	return inv, nil
}

// ParseConf decodes and validates the network configuration.
func ParseConf(stdin []byte) (*NetConf, error) {
	var conf NetConf
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("decode network config: %v", err), "")
	}
	if e := utils.ValidateNetworkName(conf.Name); e != nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "name: "+e.Msg, e.Details)
	}
	if conf.Type != PluginType {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("type is %q, want %q", conf.Type, PluginType), "")
	}
	if conf.CNIVersion == "" {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "cniVersion is missing", "")
	}
	if ok, _ := version.GreaterThanOrEqualTo(conf.CNIVersion, "0.3.0"); !ok {
		return nil, types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("cniVersion %q is not supported (0.3.0 to 1.1.0)", conf.CNIVersion), "")
	}
	if conf.MTU != 0 && (conf.MTU < 576 || conf.MTU > 65535) {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("mtu %d is out of range 576..65535", conf.MTU), "")
	}
	if err := parsePrevResult(&conf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("prevResult: %v", err), "")
	}
	return &conf, nil
}

// parsePrevResult sets conf.PrevResult from the raw prevResult. One that
// names its version is decoded once, as version.ParsePrevResult would end
// up decoding it; any other goes the CNI library's way (a map, then back
// through JSON), which gives it the config's version.
func parsePrevResult(conf *NetConf) error {
	raw := conf.PrevResultJSON
	conf.PrevResultJSON = nil
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if res, err := version.NewResult(conf.CNIVersion, raw); err == nil && res.Version() != "" {
		conf.PrevResult = res
		return nil
	}
	if err := json.Unmarshal(raw, &conf.RawPrevResult); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	return version.ParsePrevResult(&conf.PluginConf)
}

// ParseArgs parses CNI_ARGS ("K1=V1;K2=V2"). Unknown keys are kept and
// ignored by callers, as runtimes pass keys plugins do not know.
func ParseArgs(s string) (map[string]string, error) {
	out := map[string]string{}
	if s == "" {
		return out, nil
	}
	for _, pair := range strings.Split(s, ";") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok || k == "" {
			return nil, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_ARGS: %q is not KEY=VALUE", pair), "")
		}
		out[k] = v
	}
	return out, nil
}
