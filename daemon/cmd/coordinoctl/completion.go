package main

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"strings"
)

// runCompletion prints a bash completion script generated from the command
// table, so it never lags behind the commands.
func runCompletion(_ context.Context, c *client, args []string) error {
	if args[0] != "bash" {
		return fmt.Errorf("%w: shell %q: only bash is supported", errUsage, args[0])
	}
	top := map[string]bool{}
	sub := map[string][]string{}
	flagsOf := map[string][]string{}
	for _, cmd := range commands {
		first, second, two := strings.Cut(cmd.name, " ")
		top[first] = true
		if two {
			sub[first] = append(sub[first], second)
		}
		fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
		new(globals).register(fs)
		if cmd.flags != nil {
			cmd.flags(fs)
		}
		fs.VisitAll(func(f *flag.Flag) {
			dash := "--"
			if len(f.Name) == 1 {
				dash = "-"
			}
			flagsOf[first] = append(flagsOf[first], dash+f.Name)
		})
	}
	var names []string
	for n := range top {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(c.out, "# bash completion for coordinoctl: source <(coordinoctl completion bash)")
	fmt.Fprintln(c.out, "_coordinoctl() {")
	fmt.Fprintln(c.out, `  local cur=${COMP_WORDS[COMP_CWORD]} cmd=${COMP_WORDS[1]}`)
	fmt.Fprintf(c.out, "  if [ \"$COMP_CWORD\" -eq 1 ]; then COMPREPLY=($(compgen -W %q -- \"$cur\")); return; fi\n", strings.Join(names, " "))
	fmt.Fprintln(c.out, `  case "$cmd" in`)
	for _, n := range names {
		words := dedupe(flagsOf[n])
		if s := sub[n]; len(s) > 0 {
			fmt.Fprintf(c.out, "    %s) if [ \"$COMP_CWORD\" -eq 2 ]; then COMPREPLY=($(compgen -W %q -- \"$cur\")); else COMPREPLY=($(compgen -W %q -- \"$cur\")); fi ;;\n",
				n, strings.Join(s, " "), strings.Join(words, " "))
			continue
		}
		fmt.Fprintf(c.out, "    %s) COMPREPLY=($(compgen -W %q -- \"$cur\")) ;;\n", n, strings.Join(words, " "))
	}
	fmt.Fprintln(c.out, "  esac")
	fmt.Fprintln(c.out, "}")
	fmt.Fprintln(c.out, "complete -F _coordinoctl coordinoctl")
	return nil
}

func dedupe(s []string) []string {
	sort.Strings(s)
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}
