package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"go.uber.org/zap"

	"github.com/coordino/coordino/bpf"
)

// mapCounter counts one map's entries without reading them: a bpf_map
// iterator that reports the kernel's own count of every map
// (bpf/coordino_count.c, kernel 6.6+). A scrape of the conntrack table's
// size then costs the same at 100 entries or at a million.
type mapCounter struct {
	objs bpf.CoordinoCountObjects
	iter *link.Iter
	id   ebpf.MapID
}

// openMapCounter returns the counter of m, or nil where the kernel cannot
// count (the caller then reads the map).
func openMapCounter(m *ebpf.Map, log *zap.Logger) *mapCounter {
	c, err := newMapCounter(m)
	if err != nil {
		log.Info("counting conntrack entries by reading the table", zap.Error(err))
		return nil
	}
	return c
}

func newMapCounter(m *ebpf.Map) (*mapCounter, error) {
	info, err := m.Info()
	if err != nil {
		return nil, fmt.Errorf("map info: %w", err)
	}
	id, ok := info.ID()
	if !ok {
		return nil, errors.New("map ID not available")
	}
	c := &mapCounter{id: id}
	if err := bpf.LoadCoordinoCountObjects(&c.objs, nil); err != nil {
		return nil, fmt.Errorf("load map count iterator: %w", err)
	}
	if c.iter, err = link.AttachIter(link.IterOptions{Program: c.objs.CdoMapCounts}); err != nil {
		c.objs.Close()
		return nil, fmt.Errorf("attach map count iterator: %w", err)
	}
	return c, nil
}

// count is the number of entries in the map.
func (c *mapCounter) count() (int, error) {
	rd, err := c.iter.Open()
	if err != nil {
		return 0, fmt.Errorf("open map count iterator: %w", err)
	}
	defer rd.Close()
	var rec bpf.CoordinoCountMapCount
	for {
		if err := binary.Read(rd, binary.NativeEndian, &rec); err != nil {
			if errors.Is(err, io.EOF) {
				return 0, fmt.Errorf("map %d not among the kernel's maps", c.id)
			}
			return 0, fmt.Errorf("read map counts: %w", err)
		}
		if ebpf.MapID(rec.Id) == c.id {
			return int(rec.Count), nil
		}
	}
}

func (c *mapCounter) Close() error {
	return errors.Join(c.iter.Close(), c.objs.Close())
}
