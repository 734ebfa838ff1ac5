// Command cluster brings the multi-node test cluster of test/cluster up
// (`cluster up -workers N`, returns once nodes are Ready with Coordino
// installed and leaves it running) and down (`cluster down`).
package main
