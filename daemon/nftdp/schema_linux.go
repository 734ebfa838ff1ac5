package nftdp

import (
	"fmt"

	"github.com/google/nftables"
	"go.uber.org/zap"

	"github.com/coordino/coordino/internal/schema"
)

// TableFormat is the layout of the datapath's table. Version 2 added the
// flow log (limit objects, allowed-flow chains, log rules in the endpoint
// chains): a version 1 daemon reads it as its own, so MinReader stays 1.
// Version 3 added node isolation's sets and chains: an older daemon's
// start rewrites the hook chains without the jumps to them, leaving them
// unused (it enforces no node isolation and says so). Version 4 added the
// allowed-flow chain of the output hook (flows the node opens to its
// pods) and anonymous port sets in pair chains: an older daemon leaves
// the first as it is and rewrites pair chains whole. Version 5 added the
// pod-ifs set, which node isolation's jumps and the allowed-flow rules
// look interfaces up in (kernels such as 6.1 refuse a membership lookup in
// a map): an older daemon rewrites those rules with its own lookups and
// leaves the set unused. A change an older daemon would misread raises
// MinReader with Current.
var TableFormat = schema.Format{What: "nftables table", Current: 5, MinReader: 1}

// tableWhere names the table in schema errors.
const tableWhere = "inet " + TableName

// The stamp is a named counter no rule uses, its name holding both
// numbers ("schema-v5-min1"): google/nftables has no table userdata, and
// a name cannot be changed behind the datapath's back by counting. Its
// form never changes: every version must be able to read it.
const stampFormat = "schema-v%d-min%d"

func stampName(s schema.Stamp) string { return fmt.Sprintf(stampFormat, s.Version, s.MinReader) }

// parseStamp reads a stamp object's name; ok is false for other objects.
func parseStamp(name string) (schema.Stamp, bool) {
	var s schema.Stamp
	if n, err := fmt.Sscanf(name, stampFormat, &s.Version, &s.MinReader); err != nil || n != 2 || stampName(s) != name {
		return schema.Stamp{}, false
	}
	return s, true
}

// readStamps returns the stamp objects of the existing table (none on a
// table written before stamps).
func readStamps(c *nftables.Conn, t *nftables.Table) ([]schema.Stamp, error) {
	objs, err := c.GetNamedObjects(t)
	if err != nil {
		return nil, fmt.Errorf("nftables datapath: read the schema stamp of %s: %w", tableWhere, err)
	}
	var out []schema.Stamp
	for _, o := range objs {
		if n, ok := o.(*nftables.NamedObj); ok && n.Type == nftables.ObjTypeCounter {
			if s, ok := parseStamp(n.Name); ok {
				out = append(out, s)
			}
		}
	}
	return out, nil
}

// checkTableSchema decides what this build does with the existing table:
// too new a table is refused with a *schema.TooNewError before anything in
// it is changed, so the policy it holds stays in force.
func (d *Datapath) checkTableSchema() error {
	stamps, err := readStamps(d.conn, d.lay.table)
	if err != nil {
		return err
	}
	if len(stamps) > 1 {
		return fmt.Errorf("nftables datapath: %s has %d schema stamps %v: refusing to use it and leaving it untouched", tableWhere, len(stamps), stamps)
	}
	found := schema.Stamp{}
	if len(stamps) == 1 {
		found = stamps[0]
	}
	decision, err := TableFormat.Check(tableWhere, found)
	if err != nil {
		return fmt.Errorf("nftables datapath: %w", err)
	}
	d.tableStamp, d.tableDecision = found, decision
	if decision == schema.Migrate {
		d.log.Info("migrating the nftables table to this build's schema", zap.String("table", tableWhere),
			zap.Uint32("from", found.Version), zap.Uint32("to", TableFormat.Current))
	}
	return nil
}

// stamp queues, in ensure's transaction, the stamp this build leaves: its
// own on a new, migrated or current table, the newer one kept on a table
// a newer build wrote and this one reads.
func (d *Datapath) stamp(c *nftables.Conn) {
	if d.tableDecision == schema.ReadNewer {
		return
	}
	want := TableFormat.Stamp()
	if d.tableStamp != (schema.Stamp{}) && d.tableStamp != want {
		c.DeleteObject(&nftables.CounterObj{Table: d.lay.table, Name: stampName(d.tableStamp)})
	}
	c.AddObj(&nftables.CounterObj{Table: d.lay.table, Name: stampName(want)})
}
