package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/doctor"
	"github.com/spf13/cobra"
)

// Exit codes of fence doctor, by the worst finding. 2 (ExitUsage) means a
// usage error or a deployment that could not be read.
const (
	ExitDoctorWarning  = 1 // the worst finding is a warning
	ExitDoctorCritical = 3 // at least one finding is critical
)

func doctorCmd() *cobra.Command {
	var rf redisFlags
	var rl redlockBackend
	var asJSON bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Audit a Redis deployment for the hazards that break locks or fencing tokens",
		Long: `Doctor reads the Redis deployment that --redis, --redis-sentinel, --redis-cluster or
--redlock names (it writes nothing) and reports each hazard that can break fence's locks or tokens: persistence
that loses locks on a restart, eviction that can remove lock keys or token records, replicas
missing, lagging or too few for --acks, min-replicas settings, Sentinel quorum and
down-after-milliseconds against the lease time (--watchdog-ttl), Cluster slot coverage and
replicas per master, clock skew between the nodes, and EVAL, EVALSHA, WAIT or key permissions
that are renamed, disabled or denied by ACL. Each finding has a severity, why it matters and
the fix. Give --acks, --replicas and --no-replica-sync as the lockers use them.

With --redlock (or FENCE_REDLOCK_URLS) each master is audited as a standalone Redis, and
Redlock's own assumptions are checked: fewer than 3 masters or an even number, masters that are
one server or replicate one another (not independent), replicas under a master, persistence
without the rule that a crashed master stays down for a lease time, and clock skew between
the masters.

Exit status: 0 when nothing worse than info was found, 1 when the worst finding is a
warning, 3 when one is critical, 2 on a usage error or when the deployment could not be
read within --timeout; 130 if interrupted (SIGINT, SIGTERM).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if timeout <= 0 {
				return exitWith(ExitUsage, errors.New("--timeout must be positive, got "+timeout.String()))
			}
			if err := emptyBackendFlag(cmd, []backend{&rl}); err != nil {
				return exitWith(ExitUsage, err)
			}
			ct, err := redisTLS(cmd)
			if err != nil {
				return exitWith(ExitUsage, err)
			}
			cfg, err := rf.doctorConfig(cmd.Flags().Changed, rl.urls, ct)
			if err != nil {
				return exitWith(ExitUsage, err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			findings, err := doctor.Run(ctx, cfg)
			if err != nil && cmd.Context().Err() != nil {
				return exitWith(ExitInterrupted, err) // SIGINT or SIGTERM, as exec, status and demo say it
			}
			if err != nil {
				err = rf.tlsHint(ctx, err)
				return exitWith(ExitUsage, err)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if findings == nil {
					findings = []doctor.Finding{}
				}
				worst := "none"
				if w := doctor.Worst(findings); w != 0 {
					worst = w.String()
				}
				if err := encodeJSON(out, map[string]any{"worst": worst, "findings": findings}); err != nil {
					return exitWith(ExitUsage, err)
				}
			} else {
				printFindings(out, findings)
			}
			switch doctor.Worst(findings) {
			case doctor.Critical:
				return exitWith(ExitDoctorCritical, nil)
			case doctor.Warning:
				return exitWith(ExitDoctorWarning, nil)
			}
			return nil
		},
	}
	rf.register(cmd)
	rl.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, `print one JSON object: {"worst": "none"|"info"|"warning"|"critical", "findings": [{"id", "severity", "node", "why", "fix"}]}`)
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "give up, with exit status 2, when the deployment has not answered within this time")
	return cmd
}

// doctorConfig is the doctor.Config the flags describe, redlockURLs being
// --redlock's value. The doctor opens a client per node, so it takes the
// parsed options rather than one client; ct's TLS files go into each
// (see redisTLS).
func (f *redisFlags) doctorConfig(changed func(string) bool, redlockURLs string, ct *clientTLS) (doctor.Config, error) {
	rs, err := f.replicaSync(changed)
	if err != nil {
		return doctor.Config{}, err
	}
	cfg := doctor.Config{LeaseTime: f.watchdogTTL, ReplicaSync: rs}
	switch {
	case redlockURLs != "" && (f.sentinelURL != "" || f.clusterURL != "" || changed("redis")):
		return cfg, errors.New("give --redlock or one of --redis, --redis-sentinel and --redis-cluster, not both")
	case redlockURLs == "" && f.oneRedis(changed) != nil:
		return cfg, f.oneRedis(changed)
	case redlockURLs != "":
		if !changed("watchdog-ttl") {
			cfg.LeaseTime = 0 // redlock's default
		}
		for _, raw := range splitURLs(redlockURLs) {
			raw = strings.TrimSpace(raw)
			if raw == "" {
				return cfg, fmt.Errorf("--redlock %s: an empty URL in the list", redactURLs(redlockURLs))
			}
			o, err := parseURL("--redlock", raw, ct)
			if err != nil {
				return cfg, err
			}
			cfg.Redlock = append(cfg.Redlock, o)
		}
	case f.sentinelURL != "" && f.clusterURL != "":
		return cfg, errors.New("give --redis-sentinel or --redis-cluster, not both")
	case f.sentinelURL != "":
		o, err := parseFailoverURL("--redis-sentinel", f.sentinelURL, ct)
		if err != nil {
			return cfg, err
		}
		if o.MasterName == "" {
			return cfg, errors.New("--redis-sentinel: the URL needs master_name=NAME")
		}
		cfg.Sentinel = o
	case f.clusterURL != "":
		o, err := parseClusterURL("--redis-cluster", f.clusterURL, ct)
		if err != nil {
			return cfg, err
		}
		cfg.Cluster = o
	default:
		o, err := parseURL("--redis", f.url, ct)
		if err != nil {
			return cfg, err
		}
		cfg.Standalone, f.standalone = o, o
	}
	return cfg, nil
}

// printFindings prints one block per finding: a line with its severity,
// id and node in aligned columns, then why and fix wrapped beneath it.
func printFindings(w io.Writer, findings []doctor.Finding) {
	if len(findings) == 0 {
		fmt.Fprintln(w, "fence doctor: no findings")
		return
	}
	idWidth := 0
	for _, f := range findings {
		idWidth = max(idWidth, len(f.ID))
	}
	counts := map[doctor.Severity]int{}
	for _, f := range findings {
		counts[f.Severity]++
		fmt.Fprintf(w, "%-8s  %-*s  %s\n", strings.ToUpper(f.Severity.String()), idWidth, f.ID, f.Node)
		wrap(w, "    why: ", f.Why)
		wrap(w, "    fix: ", f.Fix)
	}
	noun := "findings"
	if len(findings) == 1 {
		noun = "finding"
	}
	fmt.Fprintf(w, "%d %s: %d critical, %d warning, %d info\n",
		len(findings), noun, counts[doctor.Critical], counts[doctor.Warning], counts[doctor.Info])
}

// wrap prints text after prefix, wrapped at 100 columns, with continuation
// lines indented as far as the prefix.
func wrap(w io.Writer, prefix, text string) {
	const width = 100
	line, indent := prefix, strings.Repeat(" ", len(prefix))
	for i, word := range strings.Fields(text) {
		if i > 0 && len(line)+1+len(word) > width {
			fmt.Fprintln(w, line)
			line = indent + word
			continue
		}
		if i > 0 {
			line += " "
		}
		line += word
	}
	fmt.Fprintln(w, line)
}
