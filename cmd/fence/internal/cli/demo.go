package cli

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/fencekit/fence/cmd/fence/internal/demo"
	"github.com/spf13/cobra"
)

func demoCmd() *cobra.Command {
	var noFailover bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Tell the article's stories live: a paused worker and a failover",
		Long: `Demo tells the stories of the article that fence was made from, as timelines.

First, a worker pauses past its lease while another takes the lock and approves payment 1001:
without fencing the stale worker's write lands and the payment is charged twice; with
fencing it is rejected. These run on an embedded Redis (miniredis) and SQLite in memory, so
nothing needs to be installed.

Where redis-server is on the PATH, it then runs the failover story on real processes: the
primary dies before its replica has the lock and a second worker takes the same lock on the
promoted replica; with the replica sync check the first acquisition is refused instead.

Colour is used when standard output is a terminal and NO_COLOR is not set. Exit status: 0 when
every story went as told; 130 if interrupted (SIGINT, SIGTERM); 2 otherwise.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// A reader that goes away (fence demo | head) must fail the
			// demo's writes, which stops it and cleans up; left to
			// SIGPIPE, fence died on the spot and left its files in
			// TMPDIR. Notify, unlike Ignore, is not inherited by the
			// demo's redis-server processes.
			sigpipe := make(chan os.Signal, 1)
			signal.Notify(sigpipe, syscall.SIGPIPE)
			defer signal.Stop(sigpipe)
			err := demo.Run(cmd.Context(), cmd.OutOrStdout(), demo.Options{
				Color:        isTerminal(os.Stdout) && os.Getenv("NO_COLOR") == "",
				SkipFailover: noFailover,
			})
			if err != nil && cmd.Context().Err() != nil {
				return exitWith(ExitInterrupted, err) // SIGINT or SIGTERM, as exec and status say it
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&noFailover, "no-failover", false, "skip the failover stories even when redis-server is on the PATH")
	return cmd
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
