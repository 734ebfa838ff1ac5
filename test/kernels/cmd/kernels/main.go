// Command kernels runs the kernel matrix (`make test-kernels`): the suites
// of test/kernels on the host and in qemu guests on Debian's 6.1 and 6.12
// kernels. See docs/kernels.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"

	"github.com/coordino/coordino/test/kernels"
)

func main() {
	guest := flag.String("guest", "", "run as a guest's first process with this plan (init.sh passes it)")
	kernelList := flag.String("kernels", "host "+strings.Join(kernels.Series(), " "), "kernels to run on: host and Debian series")
	suites := flag.String("suites", "", "regexp of the suite names to run (default all)")
	run := flag.String("run", "", "replaces the chosen suites' -test.run")
	repo := flag.String("repo", ".", "repository root")
	cache := flag.String("cache", kernels.DefaultCacheDir, "where kernels and initramfs are kept")
	slowdown := flag.Int("slowdown", 10, "COORDINO_TEST_SLOWDOWN in guests: how many times slower than the host code runs")
	verbose := flag.Bool("v", false, "show the guests' consoles")
	noConntrack := flag.Bool("no-conntrack", false, "do not load nf_conntrack in guests before the suites")
	hostNote := flag.String("host-note", "", "when host is not among -kernels: what ran on the host instead (a row of the table)")
	flag.Parse()
	if *guest != "" {
		kernels.Guest(*guest)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	chosen, err := kernels.SelectSuites(*suites)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	opts := kernels.Options{Repo: *repo, Cache: *cache, Kernels: strings.Fields(*kernelList), Suites: chosen,
		Run: *run, Slowdown: *slowdown, NoConntrack: *noConntrack,
		Logf: func(f string, a ...any) { fmt.Fprintf(os.Stderr, "kernels: "+f+"\n", a...) }}
	if *verbose {
		opts.Live = os.Stderr
	}
	if opts.Repo, err = filepath.Abs(opts.Repo); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	results, err := kernels.Matrix(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kernels:", err)
		os.Exit(1)
	}
	if *hostNote != "" && !slices.Contains(opts.Kernels, kernels.Host) {
		results = append([]kernels.KernelResult{{Kernel: kernels.Host, Detail: "not run here", Note: *hostNote}}, results...)
	}
	for _, k := range results {
		kernels.PrintKernel(os.Stdout, k)
	}
	if kernels.PrintSummary(os.Stdout, results) > 0 {
		os.Exit(1)
	}
}
