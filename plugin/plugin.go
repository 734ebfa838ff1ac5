package plugin

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/types/create"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/coordino/coordino/plugin/deletequeue"
	cniv1 "github.com/coordino/coordino/proto/cni/v1"
)

// SupportedVersions are the CNI spec versions Coordino speaks.
var SupportedVersions = version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

// About is printed by VERSION when CNI_COMMAND is absent.
const About = "coordino: Kubernetes CNI (thin plugin; the work is done by coordino-daemon)"

// Main runs the plugin. It is the whole of the binary's main function.
func Main() {
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:    cmdAdd,
		Del:    cmdDel,
		Check:  cmdCheck,
		GC:     cmdGC,
		Status: cmdStatus,
	}, SupportedVersions, About)
}

func request(args *skel.CmdArgs) *cniv1.CNIRequest {
	return &cniv1.CNIRequest{
		ContainerId: args.ContainerID,
		Netns:       args.Netns,
		Ifname:      args.IfName,
		Args:        args.Args,
		Path:        args.Path,
		Stdin:       args.StdinData,
	}
}

func cmdAdd(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	c, err := dial(conf)
	if err != nil {
		return types.NewError(types.ErrTryAgainLater, err.Error(), "")
	}
	defer c.close()
	resp, err := c.call(c.api.Add, request(args), true)
	if err != nil {
		return unreachableAs(err, types.ErrTryAgainLater)
	}
	result, err := create.CreateFromBytes(resp.Result)
	if err != nil {
		return types.NewError(types.ErrInternal, fmt.Sprintf("decode daemon result: %v", err), "")
	}
	return types.PrintResult(result, conf.CNIVersion)
}

// cmdDel never fails because the daemon is away: the request is queued on
// disk and replayed by the daemon before it serves again, so a pod can never
// be stuck terminating behind a daemon restart.
func cmdDel(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	req := request(args)
	c, err := dial(conf)
	if err == nil {
		defer c.close()
		_, err = c.call(c.api.Del, req, false)
	}
	if err == nil || !errors.Is(err, errUnreachable) {
		return err
	}
	return queueDel(conf, req, err)
}

// queueDel stores a DEL the daemon could not take, in the verified runDir.
func queueDel(conf *Config, req *cniv1.CNIRequest, unreachable error) error {
	d, err := openRunDir(conf, true)
	if err != nil {
		return err
	}
	defer d.close()
	dir, closeDir, err := d.queueDir()
	if err != nil {
		return err
	}
	defer closeDir()
	if qerr := deletequeue.Write(dir, req); qerr != nil {
		return types.NewError(types.ErrIOFailure, fmt.Sprintf("%v; and queueing the DEL in %s failed: %v", unreachable, conf.QueueDir(), qerr), "")
	}
	return nil
}

func cmdCheck(args *skel.CmdArgs) error {
	return forward(args, func(c *client) verbFunc { return c.api.Check }, types.ErrTryAgainLater)
}

func cmdGC(args *skel.CmdArgs) error {
	return forward(args, func(c *client) verbFunc { return c.api.GC }, types.ErrTryAgainLater)
}

func cmdStatus(args *skel.CmdArgs) error {
	return forward(args, func(c *client) verbFunc { return c.api.Status }, types.ErrPluginNotAvailable)
}

// forward sends a verb that has no result and maps an unreachable daemon to unreachableCode.
func forward(args *skel.CmdArgs, verb func(*client) verbFunc, unreachableCode uint) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	c, err := dial(conf)
	if err != nil {
		return types.NewError(unreachableCode, err.Error(), "")
	}
	defer c.close()
	_, err = c.call(verb(c), request(args), true)
	return unreachableAs(err, unreachableCode)
}

func unreachableAs(err error, code uint) error {
	if errors.Is(err, errUnreachable) {
		return types.NewError(code, err.Error(), "")
	}
	return err
}
