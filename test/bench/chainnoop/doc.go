// Command chainnoop is a chained CNI plugin that does nothing but hand
// prevResult on. The benchmark runs it after bridge+host-local to measure
// what any second Go plugin process in a chain costs through libcni: the
// floor under Coordino's chained cost.
package main
