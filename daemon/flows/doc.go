// Package flows fans the datapath's single flow-event stream out to every
// observer: the optional JSON-lines log and each gRPC FollowFlows client.
// A slow observer loses events rather than slowing the datapath reader.
package flows
