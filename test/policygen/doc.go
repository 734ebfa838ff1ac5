// Package policygen generates the synthetic cluster the policy benchmarks
// share: namespaces with team and environment labels, pods of a few apps
// per namespace, and NetworkPolicies of the shapes clusters use (default
// deny, allow from an app's clients, a team's namespaces on a named port,
// egress to DNS by port name and to an ipBlock with an exception, tier
// rules with expressions). The controller's compile benchmark and the
// daemon's per-node cost benchmark see the same policies.
package policygen
