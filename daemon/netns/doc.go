// Package netns validates network namespace files and pins them with bind
// mounts, so the daemon can still reach a pod's network namespace for CHECK,
// DEL and GC after the container runtime has dropped its own handle.
package netns
