// Package identity assigns the numeric security identities that Coordino's
// datapath enforces policy on: one identity per unique (namespace, pod labels)
// set, reserved identities for the node and the world, and node-local CIDR
// identities for ipBlock peers. Churn is bounded by unique label sets, not pods.
package identity
