package kernels

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Boot runs plan in a qemu guest on k and returns when the guest has
// powered off, or kills it at timeout. The console goes to console.log in
// the plan's results directory (and to live, if not nil). runner is the
// harness binary, which the guest reaches through the host's / share.
func Boot(ctx context.Context, k *Kernel, plan *Plan, runner string, timeout time.Duration, live io.Writer) error {
	initrd, err := k.Initramfs()
	if err != nil {
		return fmt.Errorf("initramfs for %s: %w", k.Release, err)
	}
	data, err := json.MarshalIndent(plan, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(plan.Results, "plan.json"), data, 0o644); err != nil {
		return err
	}
	for _, p := range []string{plan.Results, runner, k.modulesDir()} {
		if strings.ContainsAny(p, " \"") {
			return fmt.Errorf("path %q: the kernel command line cannot carry spaces or quotes", p)
		}
	}
	console, err := os.Create(filepath.Join(plan.Results, "console.log"))
	if err != nil {
		return err
	}
	defer console.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// TCG: the /dev/kvm here cannot run stock kernels. The kernel's own
	// cmdline words KVER, MODULES, RESULTS and RUNNER reach init.sh as
	// environment variables; panic=-1 with -no-reboot ends qemu if init dies.
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64",
		"-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "2", "-m", "2G",
		"-nographic", "-nic", "none", "-no-reboot",
		"-kernel", k.VMLinux, "-initrd", initrd,
		"-append", strings.Join([]string{"console=ttyS0", "panic=-1", "mitigations=off", "loglevel=4",
			"KVER=" + k.Release, "MODULES=" + k.modulesDir(), "RESULTS=" + plan.Results, "RUNNER=" + runner}, " "),
		"-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
		"-virtfs", "local,path="+plan.Results+",mount_tag=results,security_model=none")
	cmd.Stdout = console
	if live != nil {
		cmd.Stdout = io.MultiWriter(console, live)
	}
	cmd.Stderr = cmd.Stdout
	cmd.Stdin = nil
	err = cmd.Run()
	if ctx.Err() == context.DeadlineExceeded {
		return fmt.Errorf("guest %s killed after %s", k.Release, timeout)
	}
	if err != nil {
		return fmt.Errorf("qemu (%s): %w", k.Release, err)
	}
	return nil
}
