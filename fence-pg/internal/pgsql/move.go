package pgsql

// Moving a scope to another database (fencepg's Seal and
// Install; leasecore.ScopeSeal describes the move).
//
// A sealed scope's floor is SealedFloor, the largest bigint, above every
// token: the fence's own comparison rejects every claim there, so the
// accepted path has no condition of its own. The seal's record lives in
// the floor row's token_space column, which otherwise holds the token space
// of the token that last raised the floor: no token raised a sealed floor,
// and the row is what a rejection reads anyway (ReadFloorSpace), with the
// privileges every fence has. At SealedFloor the column holds a JSON object
// {"moved_to", "floor", "token_space", "sealed_at"}: the destination, the
// floor and its space as they were when the scope was sealed, and when.
// The fence's raise never changes it (GREATEST keeps the sealed floor, and
// the space changes only when the floor moves up).

// SealedFloor is leasecore.SealedFloor as SQL text.
const SealedFloor = "9223372036854775807"

// SealScope seals scope $1 for the destination $2 in the caller's
// transaction and returns the seal's record (the token_space column; see
// above). INSERT ... ON CONFLICT DO UPDATE acts on the latest committed
// version of the floor row and locks it for update until the transaction
// ends, waiting for every writer that share-locks it (PostgreSQL docs, the
// INSERT page, "ON CONFLICT Clause"): every write accepted before the seal
// has committed, and its rows are visible to the caller's next statement
// (Read Committed takes a new snapshot per statement); every writer after
// it waits, then finds the sealed floor and is rejected. The SET
// expressions read the row as it was, so the record carries the floor the
// lock found. A scope sealed before keeps the record of its first seal (the
// seal is idempotent); a scope that never had a floor gets a sealed row
// with floor 0. DurableCommit: the caller's transaction commits durably.
var SealScope = `INSERT INTO leasefence.fence_floor AS f (scope, max_token, token_space)
SELECT $1::text, ` + SealedFloor + `,
  json_build_object('moved_to', $2::text, 'floor', 0, 'token_space', NULL, 'sealed_at', clock_timestamp())::text
 WHERE ` + DurableCommit + `
ON CONFLICT (scope) DO UPDATE SET
  token_space = CASE WHEN f.max_token = ` + SealedFloor + ` THEN f.token_space
    ELSE json_build_object('moved_to', $2::text, 'floor', f.max_token, 'token_space', f.token_space,
                           'sealed_at', clock_timestamp())::text END,
  max_token = ` + SealedFloor + `
RETURNING coalesce(f.token_space, '')`

// InstallEmpty is the install of a seal whose floor is 0 (the scope never
// accepted a check at the old location): nothing to raise. It share-locks
// the scope's floor row here, if there is one, until the caller's
// transaction ends, and returns the floor (0: none); the install is
// accepted only when there is none. An install with a floor runs the
// fence's own check (FenceCheck) with the seal's floor as the token.
var InstallEmpty = `SELECT coalesce((SELECT max_token FROM leasefence.fence_floor WHERE scope = $1::text FOR SHARE), 0)
 WHERE ` + DurableCommit

// ReadScopeParts returns every part of scope $1 as it is stored (part,
// content, writer, token, written_at): what the conformance harness's mover
// reads in the transaction that sealed the scope.
const ReadScopeParts = `SELECT part, content, writer, token, written_at FROM leasefence.report_part
 WHERE scope = $1::text ORDER BY part`

// CopyPart stores part $2 of scope $1 as the old location stored it ($3
// content, $4 writer, $5 token, $6 written_at): the conformance harness's
// mover writes it after the install's check, in the same transaction.
const CopyPart = `INSERT INTO leasefence.report_part AS p (scope, part, content, writer, token, written_at)
VALUES ($1::text, $2::text, $3::text, $4::text, $5::bigint, $6::timestamptz)
ON CONFLICT (scope, part) DO UPDATE SET content = EXCLUDED.content, writer = EXCLUDED.writer,
  token = EXCLUDED.token, written_at = EXCLUDED.written_at`
