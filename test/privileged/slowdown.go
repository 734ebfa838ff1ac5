package privileged

import (
	"os"
	"strconv"
	"time"
)

// SlowdownEnv tells tests how many times slower than a plain host this
// machine runs their code: the kernel matrix (test/kernels) sets it in its
// qemu guests, where code runs under TCG emulation.
const SlowdownEnv = "COORDINO_TEST_SLOWDOWN"

// Slowdown scales a wait or deadline by SlowdownEnv (1 when unset or not a
// positive integer). Use it for waits on the machine's own work, not for
// timeouts a test asserts as behaviour.
func Slowdown(d time.Duration) time.Duration {
	n, err := strconv.Atoi(os.Getenv(SlowdownEnv))
	if err != nil || n < 1 {
		return d
	}
	return d * time.Duration(n)
}
