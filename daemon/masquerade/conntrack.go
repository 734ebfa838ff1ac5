package masquerade

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ConntrackStats are the host conntrack's failure counters of the daemon's
// network namespace, summed over CPUs. A masquerade that runs out of
// source ports, or two connections that pick the same one, fail at
// conntrack's insert: their first packet is dropped (the connection is
// retried by its sender), never a packet of an established flow.
type ConntrackStats struct {
	// InsertFailed counts connections whose entry could not be inserted
	// (a clash on the translated tuple: port exhaustion under masquerade).
	InsertFailed uint64
	// Drop counts packets dropped for a conntrack failure (including the
	// table being full).
	Drop uint64
	// EarlyDrop counts entries evicted early because the table was full.
	EarlyDrop uint64
}

// statFile is per network namespace (/proc/net is the reader's).
const statFile = "/proc/self/net/stat/nf_conntrack"

// ReadConntrackStats reads the counters; an absent file (no nf_conntrack
// loaded) gives zeros.
func ReadConntrackStats() (ConntrackStats, error) {
	data, err := os.ReadFile(statFile)
	if os.IsNotExist(err) {
		return ConntrackStats{}, nil
	}
	if err != nil {
		return ConntrackStats{}, fmt.Errorf("conntrack stats: %w", err)
	}
	return parseConntrackStats(data)
}

// parseConntrackStats reads the kernel's table: a header of column names,
// then one row of hexadecimal counters per CPU.
func parseConntrackStats(data []byte) (ConntrackStats, error) {
	var st ConntrackStats
	sc := bufio.NewScanner(bytes.NewReader(data))
	if !sc.Scan() {
		return st, fmt.Errorf("conntrack stats: no header")
	}
	cols := strings.Fields(sc.Text())
	fields := map[string]*uint64{"insert_failed": &st.InsertFailed, "drop": &st.Drop, "early_drop": &st.EarlyDrop}
	for row := 2; sc.Scan(); row++ {
		vals := strings.Fields(sc.Text())
		if len(vals) == 0 {
			continue
		}
		if len(vals) != len(cols) {
			return ConntrackStats{}, fmt.Errorf("conntrack stats: line %d has %d columns, the header %d", row, len(vals), len(cols))
		}
		for i, name := range cols {
			dst := fields[name]
			if dst == nil {
				continue
			}
			v, err := strconv.ParseUint(vals[i], 16, 64)
			if err != nil {
				return ConntrackStats{}, fmt.Errorf("conntrack stats: line %d column %s: %w", row, name, err)
			}
			*dst += v
		}
	}
	return st, sc.Err()
}
