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
	"os"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	flowv1 "github.com/coordino/coordino/proto/flow/v1"
	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

// defaultSocket is the daemon's inspection socket with the default --run-dir.
const defaultSocket = "/run/coordino/inspect.sock"

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
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		return 0
	}
	name := args[0]
	args = args[1:]
	// Two-word commands.
	if (name == "endpoint" || name == "policy") && len(args) > 0 && !strings.HasPrefix(args[0], "-") {
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
	pos, err := parseInterspersed(fs, args)
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
		conn, err := grpc.NewClient("unix://"+g.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			fmt.Fprintf(stderr, "coordinoctl: %v\n", err)
			return 1
		}
		defer conn.Close()
		c.conn, c.inspect, c.flows = conn, inspectv1.NewInspectorClient(conn), flowv1.NewObserverClient(conn)
	}
	if err := cmd.run(ctx, c, pos); err != nil {
		if errors.Is(err, errUsage) {
			fmt.Fprintf(stderr, "coordinoctl %s: %v\n", cmd.name, err)
			return 2
		}
		if st, ok := status.FromError(err); ok {
			fmt.Fprintf(stderr, "coordinoctl %s: %s (socket %s)\n", cmd.name, st.Message(), g.socket)
		} else {
			fmt.Fprintf(stderr, "coordinoctl %s: %v\n", cmd.name, err)
		}
		return 1
	}
	return 0
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
	fmt.Fprintln(w, "-o table|json|yaml and --timeout. `coordinoctl <command> -h` lists a command's flags.")
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
