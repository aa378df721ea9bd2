// Package doctor audits a Redis deployment against the hazards that break
// fence's locks or its fencing tokens: persistence that loses locks on a
// restart, eviction policies that can remove lock keys or token records,
// replicas that are missing, lagging or cannot meet the acknowledgement
// rule, min-replicas settings that refuse every write, Sentinel and Cluster
// settings that fail over while leases still run, clocks that disagree
// between the nodes (the token floor is each server's clock), and the
// commands fence needs being renamed, disabled or denied by ACL.
//
// Run reads the deployment (it writes nothing) and returns one Finding per
// hazard, each with a severity, the node it concerns, why it matters (the
// failure it causes) and the fix. The checks are a table of small
// functions over one snapshot of the deployment (see checks.go).
package doctor
