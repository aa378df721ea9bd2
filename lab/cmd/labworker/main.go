// Command labworker is a worker process of fence's fault lab: it takes
// leases and reads and writes the lab's resource as its Spec (in the
// environment variable lab.WorkerEnv) says, writing its history to standard
// output as JSON lines. The lab builds and starts it; it is not meant to be
// run by hand.
package main

import (
	"os"

	"github.com/fencekit/fence/lab"
)

func main() { os.Exit(lab.WorkerMain()) }
