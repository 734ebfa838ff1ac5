// Command coordinoctl inspects the Coordino daemon of this node over its
// read-only inspection socket: status, endpoints, identities, IPAM, policy
// explanations, flows and bug reports. It changes nothing. It talks to the
// daemon only through proto/ (never daemon packages), like any other client.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	flowv1 "github.com/coordino/coordino/proto/flow/v1"
	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

// socketName is the inspection socket's name in the daemon's --run-dir, and
// defaultSocket where it is with the default --run-dir.
const (
	socketName    = "inspect.sock"
	defaultSocket = "/run/coordino/" + socketName
)

// errUsage marks command-line mistakes (exit code 2).
var errUsage = errors.New("usage")

// globals are the flags every command takes.
type globals struct {
	socket  string
	output  string
	timeout time.Duration
}

func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.socket, "socket", envOr("COORDINO_INSPECT_SOCKET", defaultSocket), "the daemon's inspection socket (<run-dir>/inspect.sock)")
	fs.StringVar(&g.output, "o", "table", "output format: table, json or yaml")
	fs.DurationVar(&g.timeout, "timeout", 30*time.Second, "give up on the daemon after this long")
}

// command is one subcommand.
type command struct {
	name    string
	summary string
	// flags declares the command's own flags.
	flags func(fs *flag.FlagSet)
	// args checks the positional arguments.
	args func(args []string) error
	run  func(ctx context.Context, c *client, args []string) error
}

// client is a connection to the daemon and the chosen output.
type client struct {
	globals
	conn    *grpc.ClientConn
	inspect inspectv1.InspectorClient
	flows   flowv1.ObserverClient
	out     io.Writer

	mu sync.Mutex
	// dialErr is the last connection attempt's error; dialed is set when it
	// reached the daemon's socket.
	dialErr error
	dialed  bool
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	lead, args, err := leadingGlobals(args)
	if err != nil {
		fmt.Fprintf(stderr, "coordinoctl: %v\n\n", err)
		usage(stderr)
		return 2
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		return 0
	}
	name := args[0]
	args = args[1:]
	if group := groupOf(name); len(group) > 0 {
		if len(args) == 0 || strings.HasPrefix(args[0], "-") || findCommand(name+" "+args[0]) == nil {
			if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
				fmt.Fprintf(stderr, "coordinoctl %s: unknown subcommand %q\n\n", name, args[0])
			} else {
				fmt.Fprintf(stderr, "coordinoctl %s: needs a subcommand\n\n", name)
			}
			groupUsage(stderr, name, group)
			return 2
		}
		name, args = name+" "+args[0], args[1:]
	}
	cmd := findCommand(name)
	if cmd == nil {
		fmt.Fprintf(stderr, "coordinoctl: unknown command %q\n\n", name)
		usage(stderr)
		return 2
	}
	var g globals
	fs := flag.NewFlagSet("coordinoctl "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	g.register(fs)
	if cmd.flags != nil {
		cmd.flags(fs)
	}
	pos, err := parseInterspersed(fs, append(lead, args...))
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if !slices.Contains([]string{"table", "json", "yaml"}, g.output) {
		fmt.Fprintf(stderr, "coordinoctl: -o %q: must be table, json or yaml\n", g.output)
		return 2
	}
	if g.timeout <= 0 {
		fmt.Fprintf(stderr, "coordinoctl: --timeout %v: must be positive\n", g.timeout)
		return 2
	}
	if cmd.args != nil {
		if err := cmd.args(pos); err != nil {
			fmt.Fprintf(stderr, "coordinoctl %s: %v\n", cmd.name, err)
			return 2
		}
	}
	c := &client{globals: g, out: stdout}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if cmd.name != "completion" {
		if err := c.connect(); err != nil {
			fmt.Fprintf(stderr, "coordinoctl: %v\n", err)
			return 1
		}
		defer c.conn.Close()
	}
	if err := cmd.run(ctx, c, pos); err != nil {
		if errors.Is(err, errUsage) {
			fmt.Fprintf(stderr, "coordinoctl %s: %v\n", cmd.name, err)
			return 2
		}
		fmt.Fprintf(stderr, "coordinoctl %s: %s\n", cmd.name, c.describe(err))
		return 1
	}
	return 0
}

// leadingGlobals takes the global flags written before the command, so
// `coordinoctl --socket X status` works like `coordinoctl status --socket X`.
func leadingGlobals(args []string) (lead, rest []string, err error) {
	fs := flag.NewFlagSet("coordinoctl", flag.ContinueOnError)
	new(globals).register(fs)
	for len(args) > 0 && strings.HasPrefix(args[0], "-") && len(args[0]) > 1 {
		name, _, withValue := strings.Cut(strings.TrimLeft(args[0], "-"), "=")
		if name == "h" || name == "help" {
			break
		}
		if fs.Lookup(name) == nil {
			return nil, nil, fmt.Errorf("unknown flag %s before the command (command flags go after it)", args[0])
		}
		if withValue {
			lead, args = append(lead, args[0]), args[1:]
			continue
		}
		if len(args) < 2 {
			return nil, nil, fmt.Errorf("flag %s needs a value", args[0])
		}
		lead, args = append(lead, args[0], args[1]), args[2:]
	}
	return lead, args, nil
}

// groupOf lists the subcommands of a two-word command group ("endpoint").
func groupOf(name string) []*command {
	var out []*command
	for i := range commands {
		if first, _, two := strings.Cut(commands[i].name, " "); two && first == name {
			out = append(out, &commands[i])
		}
	}
	return out
}

func groupUsage(w io.Writer, name string, group []*command) {
	fmt.Fprintf(w, "Usage: coordinoctl %s <subcommand> [flags]\n\nSubcommands:\n", name)
	for _, c := range group {
		fmt.Fprintf(w, "  %-17s %s\n", c.name, c.summary)
	}
}

// connect prepares the connection to the socket; gRPC dials on first use.
// The connection attempt may take the whole --timeout: gRPC's own 20 s
// limit would otherwise end a call to a daemon that accepts but does not
// answer with a transport error before --timeout's clear one.
func (c *client) connect() error {
	conn, err := grpc.NewClient("unix://"+c.socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(c.dial),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.DefaultConfig, MinConnectTimeout: c.timeout + time.Second}))
	if err != nil {
		return fmt.Errorf("socket %s: %w", c.socket, err)
	}
	c.conn, c.inspect, c.flows = conn, inspectv1.NewInspectorClient(conn), flowv1.NewObserverClient(conn)
	return nil
}

// dial connects to the socket and remembers how the last attempt went, so
// a failed call can say why in words a person can act on.
func (c *client) dial(ctx context.Context, _ string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "unix", c.socket)
	c.mu.Lock()
	c.dialErr, c.dialed = err, err == nil
	c.mu.Unlock()
	return conn, err
}

// errNoAnswer is a call that reached the socket but got no answer in time.
var errNoAnswer = errors.New("no answer")

// describe turns a failed call into what went wrong and what to do.
func (c *client) describe(err error) string {
	c.mu.Lock()
	dialErr, dialed := c.dialErr, c.dialed
	c.mu.Unlock()
	runDir := "if the daemon runs with another --run-dir, point --socket at <run-dir>/" + socketName
	st, isStatus := status.FromError(err)
	switch {
	case dialErr != nil && errors.Is(dialErr, fs.ErrNotExist):
		return fmt.Sprintf("no daemon socket at %s: the daemon is not running here; %s", c.socket, runDir)
	case dialErr != nil && errors.Is(dialErr, syscall.ECONNREFUSED):
		return fmt.Sprintf("the daemon is not answering on %s (a socket left behind by a daemon that is not running); %s", c.socket, runDir)
	case dialErr != nil && errors.Is(dialErr, fs.ErrPermission):
		return fmt.Sprintf("permission denied: root only: cannot connect to %s (run coordinoctl as root)", c.socket)
	case dialErr != nil:
		return fmt.Sprintf("cannot connect to %s: %v; %s", c.socket, dialErr, runDir)
	case errors.Is(err, errNoAnswer) || (isStatus && st.Code() == codes.DeadlineExceeded):
		return fmt.Sprintf("the daemon did not answer within %s on %s (hung or overloaded? see its log); --timeout waits longer", c.timeout, c.socket)
	case isStatus && st.Code() == codes.Unavailable && dialed && os.Geteuid() != 0:
		// The daemon closes connections of peers that are not root right
		// after accepting them (SO_PEERCRED): all the client sees is a
		// closed connection.
		return fmt.Sprintf("permission denied: root only: the daemon on %s closed the connection of uid %d (run coordinoctl as root)", c.socket, os.Geteuid())
	case isStatus && st.Code() == codes.Unimplemented && strings.Contains(st.Message(), "unknown service "+inspectv1.Inspector_ServiceDesc.ServiceName):
		return fmt.Sprintf("%s is not the daemon's inspection socket (%s): coordinoctl wants <run-dir>/%s (default %s), not the CNI socket", c.socket, st.Message(), socketName, defaultSocket)
	case isStatus:
		return fmt.Sprintf("%s (socket %s)", st.Message(), c.socket)
	}
	return err.Error()
}

// rpcContext bounds one unary call.
func (c *client) rpcContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.timeout)
}

// parseInterspersed parses flags anywhere among the positional arguments.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func findCommand(name string) *command {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "coordinoctl inspects this node's Coordino daemon (read only).")
	fmt.Fprintln(w, "\nUsage: coordinoctl <command> [flags]\n\nCommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-17s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nEvery command takes --socket (default "+defaultSocket+", or $COORDINO_INSPECT_SOCKET),")
	fmt.Fprintln(w, "-o table|json|yaml and --timeout (default 30s), before or after the command.")
	fmt.Fprintln(w, "`coordinoctl <command> -h` lists a command's flags.")
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func exactArgs(n int, what string) func([]string) error {
	return func(args []string) error {
		if len(args) != n {
			if n == 0 {
				return fmt.Errorf("takes no arguments, got %q", args)
			}
			return fmt.Errorf("needs %s", what)
		}
		return nil
	}
}
