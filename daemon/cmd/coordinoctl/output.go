package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

// marshal renders m as JSON (inspectv1.JSON: every field present, 64-bit
// numbers as numbers, the same as bug reports hold) or YAML.
func marshal(m proto.Message, format string, multiline bool) ([]byte, error) {
	indent := ""
	if multiline {
		indent = "  "
	}
	b, err := inspectv1.JSON(m, indent)
	if err != nil {
		return nil, err
	}
	if format == "yaml" {
		return yaml.JSONToYAML(b)
	}
	return b, nil
}

// print writes m as JSON or YAML, or calls table for the default output.
func (c *client) print(m proto.Message, table func(w io.Writer)) error {
	if c.output == "table" {
		tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
		table(tw)
		return tw.Flush()
	}
	b, err := marshal(m, c.output, true)
	if err != nil {
		return err
	}
	_, err = c.out.Write(b)
	return err
}

// row writes tab-separated cells.
func row(w io.Writer, cells ...any) {
	s := make([]string, len(cells))
	for i, c := range cells {
		s[i] = fmt.Sprint(c)
		if s[i] == "" {
			s[i] = "-"
		}
	}
	fmt.Fprintln(w, strings.Join(s, "\t"))
}

func percent(n, of uint32) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(of))
}

func labels(m map[string]string) string {
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}
