// Command pause is the sandbox's PID 1: it sleeps until SIGINT/SIGTERM and
// reaps re-parented children, which is all a pod sandbox container must do.
package main
