#!/bin/sh
# Builds one variant of a BPF program whose Go bindings are another build's
# (the same source with other -D flags): bpf2go compiles and strips it as it
# does every object, into a scratch directory, and only the object is kept,
# so the variant's copy of the types is never written. Run by go generate
# in bpf/ (see bpf/doc.go); arguments: the output stem, then bpf2go's.
set -eu
stem=$1
shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go tool bpf2go -output-dir "$tmp" -output-stem "$stem" "$@"
for o in "$tmp"/*.o; do
	mv "$o" .
done
