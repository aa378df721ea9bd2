// Package child holds what differs between systems when the tests, the lab
// and the example commands start and stop processes: whether a child dies
// with its parent, and how a process stops itself.
//
// On Linux a child started with DieWithParent is killed by the kernel when
// its parent dies, even by SIGKILL (PR_SET_PDEATHSIG), so a killed test
// binary leaves no redis-server behind. Other Unix systems have no such
// setting: there a child outlives a parent that is killed before its
// cleanup runs, and has to be stopped by hand.
package child
