// Command emptybin does nothing: the benchmark execs it to measure what
// starting and ending a static Go process costs on this machine, the floor
// under any Go CNI plugin.
package main
