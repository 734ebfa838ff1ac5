// Package stats holds the summary statistics the benchmarks under test/
// share (median and spread of repeated measurements), so every bench reads
// its repetitions the same way.
package stats
