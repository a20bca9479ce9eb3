package store

import "fmt"

// Lock order.
//
// Statements that wait for row locks take them in one order, so two of them
// can never wait for each other in a cycle (PostgreSQL's `deadlock
// detected`, which used to hit settle-exception, acquire-keys and
// renew-range-leases statements when a stalled instance resumed and the
// fleet was taking its work over):
//
//  1. the group's cursor row (ClaimRange);
//  2. range rows, by id;
//  3. exception rows, by (group_id, message_xid, message_id);
//  4. key-lease rows, by (group_id, message_key).
//
// A statement that locks several rows of one table locks them in that
// table's order through a SELECT ... ORDER BY ... FOR UPDATE (keyLocks,
// rangeLocks, exceptionLocks) before it changes them; one that touches two
// tables finishes the earlier table first, which the statements below force
// by making the later step read the earlier one's output (data-modifying
// CTEs otherwise run in an order PostgreSQL does not promise). Inserts of
// new rows wait only on a concurrent insert of the same key and follow the
// same order. Claims and lease renewals that skip locked rows (ReclaimRange,
// ClaimExceptions, RenewLeases) never wait. TestLockOrderHasNoDeadlocks runs the contending statements
// against each other.

// keyLocks is a CTE body that locks, in key order, the group's key-lease
// rows matching names[i] and tokens[i] (array parameters): the first step
// of every statement that deletes or moves several key leases.
func keyLocks(group, names, tokens string) string {
	return fmt.Sprintf(`
    SELECT l.message_key FROM {s}.{t}_key_lease l
    JOIN unnest(%[2]s::text[], %[3]s::uuid[]) AS r(key, token) ON l.message_key = r.key AND l.token = r.token
    WHERE l.group_id = %[1]s
    ORDER BY l.message_key
    FOR UPDATE OF l`, group, names, tokens)
}
