package plugin

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// CmdArgs is one invocation: the CNI_* environment, the network config as
// the runtime wrote it, and the part of it the plugin reads.
type CmdArgs struct {
	ContainerID string
	Netns       string
	IfName      string
	Args        string
	Path        string
	StdinData   []byte
	Conf        *Config
}

// verb is one CNI_COMMAND: its handler, the environment it needs and the
// oldest config version that has it.
type verb struct {
	run     func(*CmdArgs) error
	needs   []string
	minConf string
}

var verbs = map[string]verb{
	"ADD":    {cmdAdd, []string{"CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"}, ""},
	"DEL":    {cmdDel, []string{"CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"}, ""},
	"CHECK":  {cmdCheck, []string{"CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"}, "0.4.0"},
	"GC":     {cmdGC, []string{"CNI_PATH"}, "1.1.0"},
	"STATUS": {cmdStatus, []string{"CNI_PATH"}, "1.1.0"},
}

// Main runs the plugin. It is the whole of the binary's main function.
//
// It dispatches the verbs itself rather than through the CNI library's skel:
// that decodes the network config three times, compiles the validation
// regular expressions at start-up and, after an ADD or DEL has already run,
// enters the netns to compare it with its own — about a fifth of the
// plugin process's CPU. The checks are not lost: the daemon validates the
// container ID, interface and network name with the library's own
// functions, and refuses its own netns before it configures anything
// (daemon/request, daemon/endpoint). Codes and messages stay the library's.
func Main() {
	if err := dispatch(os.Getenv, os.Stdin, os.Stdout, os.Stderr); err != nil {
		if perr := err.Print(); perr != nil {
			fmt.Fprintf(os.Stderr, "coordino: writing the error to stdout: %v\n", perr)
		}
		os.Exit(1)
	}
}

func dispatch(getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) *types.Error {
	cmd := getenv("CNI_COMMAND")
	switch cmd {
	case "":
		fmt.Fprintln(stderr, About)
		fmt.Fprintf(stderr, "CNI protocol versions supported: %s\n", strings.Join(SupportedVersions.SupportedVersions(), ", "))
		return nil
	case "VERSION":
		if err := SupportedVersions.Encode(stdout); err != nil {
			return types.NewError(types.ErrIOFailure, err.Error(), "")
		}
		return nil
	}
	v, known := verbs[cmd]
	if !known {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("unknown CNI_COMMAND: %v", cmd), "")
	}
	var missing []string
	for _, name := range v.needs {
		if getenv(name) == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("required env variables [%s] missing", strings.Join(missing, ",")), "")
	}
	data, err := io.ReadAll(stdin)
	if err != nil {
		return types.NewError(types.ErrIOFailure, fmt.Sprintf("error reading from stdin: %v", err), "")
	}
	conf, err := ParseConfig(data)
	if err != nil {
		return asCNIError(err)
	}
	if conf.Name == "" {
		return types.NewError(types.ErrInvalidNetworkConfig, "missing network name", "")
	}
	if err := checkVersion(cmd, v.minConf, conf.CNIVersion); err != nil {
		return err
	}
	args := &CmdArgs{ContainerID: getenv("CNI_CONTAINERID"), Netns: getenv("CNI_NETNS"), IfName: getenv("CNI_IFNAME"),
		Args: getenv("CNI_ARGS"), Path: getenv("CNI_PATH"), StdinData: data, Conf: conf}
	if err := v.run(args); err != nil {
		return asCNIError(err)
	}
	return nil
}

// checkVersion refuses a config version the plugin does not speak, or one
// too old to have the verb.
func checkVersion(cmd, minConf, confVersion string) *types.Error {
	if confVersion == "" {
		confVersion = "0.1.0" // what the CNI library assumes when a config names none
	}
	if minConf != "" {
		ok, err := version.GreaterThanOrEqualTo(confVersion, minConf)
		if err != nil {
			return types.NewError(types.ErrDecodingFailure, err.Error(), "")
		}
		if !ok {
			return types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("config version does not allow %s", cmd), "")
		}
	}
	if verr := (&version.Reconciler{}).Check(confVersion, SupportedVersions); verr != nil {
		return types.NewError(types.ErrIncompatibleCNIVersion, "incompatible CNI versions", verr.Details())
	}
	return nil
}

func asCNIError(err error) *types.Error {
	var e *types.Error
	if errors.As(err, &e) {
		return e
	}
	return types.NewError(types.ErrInternal, err.Error(), "")
}
