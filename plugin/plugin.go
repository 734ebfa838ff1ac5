package plugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/types/create"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/coordino/coordino/proto/cni/v1/wire"
	"github.com/coordino/coordino/proto/deletequeue"
)

// SupportedVersions are the CNI spec versions Coordino speaks.
var SupportedVersions = version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

// About is printed by VERSION when CNI_COMMAND is absent.
const About = "coordino: Kubernetes CNI (thin plugin; the work is done by coordino-daemon)"

func request(args *CmdArgs) *wire.Request {
	return &wire.Request{
		ContainerID: args.ContainerID,
		Netns:       args.Netns,
		IfName:      args.IfName,
		Args:        args.Args,
		Path:        args.Path,
		Stdin:       args.StdinData,
	}
}

func cmdAdd(args *CmdArgs) error {
	conf := args.Conf
	resp, err := call(conf, methodAdd, request(args), true)
	if err != nil {
		return unreachableAs(err, types.ErrTryAgainLater)
	}
	raw, err := wire.DecodeResponse(resp)
	if err != nil {
		return types.NewError(types.ErrInternal, fmt.Sprintf("decode daemon response: %v", err), "")
	}
	return printResult(raw, conf.CNIVersion)
}

// printResult prints the daemon's result in the version the runtime asked
// for. A result already in that version is printed as the daemon wrote it
// (encoding/json puts cniVersion first): decoding and re-encoding it would
// change nothing but cost the plugin process a good part of its CPU.
func printResult(raw []byte, cniVersion string) error {
	if bytes.HasPrefix(raw, []byte(`{"cniVersion":"`+cniVersion+`"`)) && json.Valid(raw) {
		_, err := os.Stdout.Write(raw)
		return err
	}
	result, err := create.CreateFromBytes(raw)
	if err != nil {
		return types.NewError(types.ErrInternal, fmt.Sprintf("decode daemon result: %v", err), "")
	}
	return types.PrintResult(result, cniVersion)
}

// cmdDel never fails because the daemon is away: the request is queued on
// disk and replayed by the daemon before it serves again, so a pod can never
// be stuck terminating behind a daemon restart.
func cmdDel(args *CmdArgs) error {
	conf := args.Conf
	req := request(args)
	_, err := call(conf, methodDel, req, false)
	if err == nil || !errors.Is(err, errUnreachable) {
		return err
	}
	return queueDel(conf, req, err)
}

// queueDel stores a DEL the daemon could not take, in the verified runDir.
func queueDel(conf *Config, req *wire.Request, unreachable error) error {
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

func cmdCheck(args *CmdArgs) error { return forward(args, methodCheck, types.ErrTryAgainLater) }

func cmdGC(args *CmdArgs) error { return forward(args, methodGC, types.ErrTryAgainLater) }

func cmdStatus(args *CmdArgs) error {
	return forward(args, methodStatus, types.ErrPluginNotAvailable)
}

// forward sends a verb that has no result and maps an unreachable daemon to unreachableCode.
func forward(args *CmdArgs, method string, unreachableCode uint) error {
	_, err := call(args.Conf, method, request(args), true)
	return unreachableAs(err, unreachableCode)
}

func unreachableAs(err error, code uint) error {
	if errors.Is(err, errUnreachable) {
		return types.NewError(code, err.Error(), "")
	}
	return err
}
