package nftdp

import (
	"testing"

	"github.com/coordino/coordino/daemon/internal/testnet"
)

// Every test runs in a private node netns (testnet.Main): the table, the
// pods and their veths vanish with the test process.
func TestMain(m *testing.M) { testnet.Main(m) }
