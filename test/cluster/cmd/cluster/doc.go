// Command cluster brings the multi-node test cluster of test/cluster up
// (`cluster up -workers N`, returns once nodes are Ready with Coordino
// installed and leaves it running) and down (`cluster down`, which also
// removes the logs a failed up kept), and tells whether one is up
// (`cluster status`, exit 0 when it is: make e2e-cluster then uses it).
package main
