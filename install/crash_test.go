package install

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coordino/coordino/conflist"
)

// crashChildEnv makes the test binary act as an installer that rewrites the
// plugin and the config in a loop until it is killed (see TestMain).
const crashChildEnv = "COORDINO_INSTALL_CRASH_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) == "1" {
		crashChild()
		return
	}
	os.Exit(m.Run())
}

// crashChild alternates between two plugin binaries and two MTUs so every
// iteration really replaces both files, pausing at random between the steps
// of each write so that the parent's SIGKILL lands inside writes.
func crashChild() {
	faultHook = func(string) { time.Sleep(time.Duration(rand.IntN(400)) * time.Microsecond) }
	srcs := strings.Split(os.Getenv("CRASH_SRCS"), ",")
	fmt.Println("ready")
	for i := 0; ; i++ {
		in, err := New(Config{
			BinDir: os.Getenv("CRASH_BIN"), ConfDir: os.Getenv("CRASH_CONF"),
			PluginSource: srcs[i%2], Mode: Mode(os.Getenv("CRASH_MODE")),
			Conflist: conflist.Options{Knobs: conflist.Knobs{MTU: 1400 + i%2}},
		})
		if err == nil {
			err = in.Install()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
}

// TestCrashMidWrite SIGKILLs a looping installer at random moments, many
// times, and checks after each kill that every CNI config in the conf dir is
// complete and valid, the primary's file is untouched and the plugin is one
// of the two binaries, whole.
func TestCrashMidWrite(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	kills := 25
	if testing.Short() {
		kills = 8
	}
	cases := []struct {
		mode  Mode
		shape shape
	}{{ModePrimary, shape{}}}
	for _, sh := range shapes {
		cases = append(cases, struct {
			mode  Mode
			shape shape
		}{ModeChained, sh})
	}
	for _, tc := range cases {
		t.Run(string(tc.mode)+"/"+tc.shape.file, func(t *testing.T) {
			n := newNode(t)
			var primary []byte
			if tc.shape.file != "" {
				primary = n.addPrimary(t, tc.shape.file)
			}
			src2 := n.src + "-v2"
			src2Data := append(slices.Clone(n.srcData[:len(n.srcData)/2]), "v2"...)
			os.WriteFile(src2, src2Data, 0o755)
			rng := rand.New(rand.NewPCG(uint64(len(tc.shape.file)), 42))
			midWrite := 0
			for k := 0; k < kills; k++ {
				cmd := exec.Command(exe, "-test.run=^$")
				cmd.Env = append(os.Environ(), crashChildEnv+"=1", "CRASH_BIN="+n.bin, "CRASH_CONF="+n.conf,
					"CRASH_MODE="+string(tc.mode), "CRASH_SRCS="+n.src+","+src2)
				out, _ := cmd.StdoutPipe()
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, 6)
				if _, err := out.Read(buf); err != nil { // "ready": the loop is starting
					t.Fatalf("child: %v %s", err, stderr.String())
				}
				time.Sleep(time.Duration(rng.IntN(30_000)) * time.Microsecond)
				cmd.Process.Signal(syscall.SIGKILL)
				err := cmd.Wait()
				if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
					t.Fatalf("child was not killed but exited: %v\n%s", err, stderr.String())
				}
				if checkNode(t, n, tc.mode, tc.shape, primary, [][]byte{n.srcData, src2Data}) {
					midWrite++
				}
			}
			// The kills must really have hit writes, or this test proves nothing.
			if midWrite == 0 {
				t.Fatalf("none of %d kills landed inside a write", kills)
			}
			t.Logf("%d of %d kills left a temp file behind (killed mid-write)", midWrite, kills)

			// The next run cleans up and converges.
			in := n.installer(t, tc.mode, conflist.Knobs{MTU: 1400})
			if err := in.Install(); err != nil {
				t.Fatal(err)
			}
			for _, dir := range []string{n.bin, n.conf} {
				for name := range snapshot(t, dir) {
					if strings.HasPrefix(name, tempPrefix) {
						t.Fatalf("temp file %s survived the next install", name)
					}
				}
			}
			checkNode(t, n, tc.mode, tc.shape, primary, [][]byte{n.srcData})
		})
	}
}

// checkNode fails t unless the node's files are all complete; it reports
// whether an installer temp file was left behind.
func checkNode(t *testing.T, n *node, mode Mode, sh shape, primary []byte, bins [][]byte) (tempLeft bool) {
	t.Helper()
	for name, data := range snapshot(t, n.conf) {
		if strings.HasPrefix(name, tempPrefix) {
			tempLeft = true
			continue
		}
		if !conflist.IsConfigFile(name) {
			continue
		}
		c, err := conflist.Parse([]byte(data), name)
		if err != nil {
			t.Fatalf("after kill: %s is not a valid config: %v\n%q", name, err, data)
		}
		switch {
		case name == sh.file:
			if data != string(primary) {
				t.Fatalf("after kill: primary %s changed", name)
			}
		case mode == ModeChained:
			if want := append(slices.Clone(sh.types), "coordino"); !slices.Equal(c.PluginTypes(), want) {
				t.Fatalf("after kill: %s chain %v, want %v", name, c.PluginTypes(), want)
			}
		default:
			if !slices.Equal(c.PluginTypes(), []string{"coordino"}) {
				t.Fatalf("after kill: %s chain %v", name, c.PluginTypes())
			}
		}
	}
	for name, data := range snapshot(t, n.bin) {
		if strings.HasPrefix(name, tempPrefix) {
			tempLeft = true
			continue
		}
		if name != "coordino" || !slices.ContainsFunc(bins, func(b []byte) bool { return bytes.Equal(b, []byte(data)) }) {
			t.Fatalf("after kill: %s is not a complete plugin binary (%d bytes)", filepath.Join(n.bin, name), len(data))
		}
		if st, _ := os.Stat(filepath.Join(n.bin, name)); st.Mode().Perm() != 0o755 {
			t.Fatalf("after kill: plugin mode %v", st.Mode())
		}
	}
	return tempLeft
}
