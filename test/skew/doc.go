// Package skew tests a node through a version change: the plugin and the
// daemon of the previous release (Makefile PREVIOUS_RELEASE, built by
// hack/build-previous.sh) against those of this tree in all four pairings,
// and a daemon upgraded, restarted and rolled back under an open
// connection, each daemon adopting the state the other left. It measures
// the time from SIGTERM to the next daemon serving an ADD.
package skew
