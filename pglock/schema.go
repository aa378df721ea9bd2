package pglock

import (
	"fmt"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/pgdurable"
)

// MaxTableLen is the longest table name accepted: PostgreSQL's 63-byte
// identifiers, less the "_token" of the sequence's name.
const MaxTableLen = 63 - len("_token")

// InvalidTableError reports a table name that ValidateTable rejects. It
// matches fence.ErrInvalidOption.
type InvalidTableError struct {
	Table  string
	Reason string
}

// Error describes the name and the rule it broke.
func (e *InvalidTableError) Error() string {
	return fmt.Sprintf("pglock: invalid table name %q: %s", e.Table, e.Reason)
}

// Unwrap returns fence.ErrInvalidOption.
func (e *InvalidTableError) Unwrap() error { return fence.ErrInvalidOption }

// ValidateTable checks a table name: 1 to MaxTableLen bytes of lower-case
// ASCII letters, digits and underscores, not starting with a digit, so that
// it names the same table quoted (as pglock writes it, so that reserved
// words such as "order" work) or not (as you may write it by hand). To put
// the table in another schema, set the connection's search_path. The error
// is an *InvalidTableError.
func ValidateTable(table string) error {
	switch {
	case table == "":
		return &InvalidTableError{table, "empty"}
	case len(table) > MaxTableLen:
		return &InvalidTableError{table, fmt.Sprintf("longer than %d bytes", MaxTableLen)}
	case table[0] >= '0' && table[0] <= '9':
		return &InvalidTableError{table, "starts with a digit"}
	}
	for i, r := range table {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			return &InvalidTableError{table, fmt.Sprintf("character %q at byte %d: want a-z, 0-9 or _", r, i)}
		}
	}
	return nil
}

// Schema returns the SQL that creates the lease table called table and its
// token sequence, if they do not exist, for migrations that create them
// themselves. An invalid table name (see ValidateTable) is an
// *InvalidTableError and no SQL: quoting cannot make an untrusted name safe
// for a migration runner that splits scripts on ";". The sequence is a
// bigint that never cycles: nextval fails rather than issue a token again.
func Schema(table string) (string, error) {
	if err := ValidateTable(table); err != nil {
		return "", err
	}
	return fmt.Sprintf(`CREATE SEQUENCE IF NOT EXISTS "%[1]s_token" AS bigint MINVALUE 1 NO CYCLE;
CREATE TABLE IF NOT EXISTS "%[1]s" (
	name       text PRIMARY KEY,
	owner      text NOT NULL,
	token      bigint NOT NULL,
	expires_at timestamptz NOT NULL
);`, table), nil
}

// queries are the statements of a Locker, built once for its table. Every
// time is the database's: clock_timestamp(), not the client's clock nor the
// transaction's start (now()).
type queries struct {
	acquire, create, left, renew, release string
}

func newQueries(t string) queries {
	return queries{
		// Take the lock if its row has expired or was released. The token
		// is drawn from the sequence as the row is updated, under the
		// row's lock: if another transaction updated the row meanwhile,
		// PostgreSQL re-evaluates the statement on the new version
		// (EvalPlanQual), drawing a new token, so the tokens of one name
		// increase in the order of the grants. An INSERT that drew its
		// token in VALUES would not: its nextval runs before it waits for
		// the conflicting row, and a token drawn early could be granted
		// after a later one. That is why rows are never deleted.
		//
		// The token is also at least the database's clock in
		// microseconds and the row's last token plus one: a sequence
		// restarted or dropped and created again (a careless operator,
		// a migration rerun, a crash under synchronous_commit off) would
		// issue tokens from 1 again, below those the resource has seen.
		// The row's last token plus one keeps a name's tokens strictly
		// increasing while its row lives even if the clock steps back;
		// past the bigint maximum it fails (numeric_value_out_of_range),
		// as nextval does, rather than issue a token again.
		//
		// A row this attempt already owns is granted again (with a new
		// token): an earlier try whose reply was lost may have taken it.
		//
		// Neither it nor a renewal moves a live row's expiry earlier: a
		// statement held up on its way (or resent) after an Extend with a
		// longer lease would cut it below the holder's Deadline, and
		// another Locker could take the row inside the lease.
		//
		// It and a renewal commit durably (see pgdurable.Commit).
		acquire: fmt.Sprintf(`UPDATE "%[1]s"
SET owner = $2, token = greatest(nextval('"%[1]s_token"'),
    (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, token + 1),
  expires_at = CASE WHEN owner = $2 THEN greatest(expires_at, clock_timestamp() + $3::bigint * interval '1 microsecond')
    ELSE clock_timestamp() + $3::bigint * interval '1 microsecond' END
WHERE name = $1 AND (expires_at <= clock_timestamp() OR owner = $2) AND %[2]s
RETURNING token`, t, pgdurable.Commit),
		// The first acquisition of a name creates its row, free.
		create: fmt.Sprintf(`INSERT INTO "%s" (name, owner, token, expires_at)
VALUES ($1, '', 0, '-infinity') ON CONFLICT (name) DO NOTHING`, t),
		left: fmt.Sprintf(`SELECT CASE WHEN expires_at <= clock_timestamp() THEN 0
ELSE (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint END
FROM "%s" WHERE name = $1`, t),
		renew: fmt.Sprintf(`UPDATE "%s" SET expires_at = greatest(expires_at, clock_timestamp() + $3::bigint * interval '1 microsecond')
WHERE name = $1 AND owner = $2 AND expires_at > clock_timestamp() AND %s`, t, pgdurable.Commit),
		// Free our own row if it has not expired and notify the waiters
		// (at commit). No row: the lease was lost.
		release: fmt.Sprintf(`UPDATE "%s" SET owner = '', expires_at = clock_timestamp()
WHERE name = $1 AND owner = $2 AND expires_at > clock_timestamp()
RETURNING pg_notify($3, $1)::text`, t),
	}
}
